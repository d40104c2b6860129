"""The convolution cases the dlight and implicit-GEMM convolution tests share.

Each is the keyword arguments of ``workloads.conv``; comments give the GEMM it normalises to.
"""

# family -> the arguments of workloads.conv; comments give the GEMM dlight makes of it.
CONV_CASES = {
    # I = 2*11*10 = 220 (7 tiles), J = 7, K = 72 (5 panels).
    "conv2d-nhwc-stride2-pad1": {
        "data_shape": (2, 21, 19, 8),
        "weight_shape": (3, 3, 8, 7),
        "layout": "NHWC",
        "stride": 2,
        "padding": 1,
    },
    # I = 2*10*12 = 240 (8 tiles), J = 70 (2 tiles), K = 72; asymmetric padding, dilation 2 in H.
    "conv2d-nchw-dilated-asym-pad": {
        "data_shape": (2, 8, 13, 23),
        "weight_shape": (70, 8, 3, 3),
        "layout": "NCHW",
        "stride": (1, 2),
        "padding": (1, 2, 0, 1),
        "dilation": (2, 1),
    },
    # I = 3*75 = 225 (8 tiles), J = 9, K = 60 (4 panels).
    "conv1d-nwc-stride2": {
        "data_shape": (3, 150, 12),
        "weight_shape": (5, 12, 9),
        "layout": "NWC",
        "stride": 2,
        "padding": 2,
    },
    # I = 2*101 = 202 (7 tiles), J = 9, K = 60; end padding only, dilation 3.
    "conv1d-ncw-dilated": {
        "data_shape": (2, 12, 110),
        "weight_shape": (9, 12, 5),
        "layout": "NCW",
        "padding": (0, 3),
        "dilation": 3,
    },
    # I = 7*9*8 = 504 (16 tiles), J = 6, K = 108 (7 panels).
    "conv3d-ndhwc-pad1": {
        "data_shape": (1, 7, 9, 8, 4),
        "weight_shape": (3, 3, 3, 4, 6),
        "layout": "NDHWC",
        "padding": 1,
    },
    # I = 2*3*8*3 = 144 (5 tiles), J = 6, K = 72.
    "conv3d-ncdhw-strided": {
        "data_shape": (2, 4, 7, 9, 8),
        "weight_shape": (6, 4, 3, 2, 3),
        "layout": "NCDHW",
        "stride": (2, 1, 2),
    },
}


CONV_MATRIX_FAMILY = "conv2d-nhwc-stride2-pad1"


CONV_EPILOGUE_CASES = {
    "conv2d-nhwc-bias-relu-residual": {
        **CONV_CASES["conv2d-nhwc-stride2-pad1"],
        "epilogue": "bias_relu_residual",
    },
    "conv2d-nchw-bias": {**CONV_CASES["conv2d-nchw-dilated-asym-pad"], "epilogue": "bias"},
}


# Grouped convolutions: a batched implicit GEMM over the groups once the output-channel axis is
# split into (group, channel in group) (tvm_streamk.transform.group_axis); comments give that GEMM.
GROUPED_CONV_CASES = {
    # S = 2 groups, I = 2*21*19 = 798 (25 tiles), J = 35, K = 3*3*4 = 36 (3 panels).
    "grouped-nhwc-groups2": {
        "data_shape": (2, 21, 19, 8),
        "weight_shape": (3, 3, 4, 70),
        "layout": "NHWC",
        "groups": 2,
        "padding": 1,
    },
    # S = 4 groups, I = 1*14*14 = 196 (7 tiles), J = 34, K = 34 (3 panels): ShuffleNet's 1x1.
    "grouped-nchw-1x1-groups4": {
        "data_shape": (1, 136, 14, 14),
        "weight_shape": (136, 34, 1, 1),
        "layout": "NCHW",
        "groups": 4,
    },
    # S = 4 groups, I = 2*10*11 = 220 (7 tiles), J = 20, K = 3*3*4 = 36 (3 panels), stride 2.
    "grouped-nchw-stride2": {
        "data_shape": (2, 16, 19, 21),
        "weight_shape": (80, 4, 3, 3),
        "layout": "NCHW",
        "groups": 4,
        "stride": 2,
        "padding": 1,
    },
}


# TVM's own TE convolutions (``tvm.s_tir.meta_schedule.testing.te_workload``: the function, its
# keyword arguments, the layout of ``workloads.conv_reference``), small enough to run on PoCL.
# dlight's gpu.Matmul declines each: they read input channel co // CO * CI + rc, even ungrouped.
# Comments give the GEMM StreamKImplicitGEMM makes of it (64 x bn tiles, 16-deep K panels).
TE_CONV_CASES = {
    # I = 2*100 = 200 (4 tiles), J = 20 (bn 32), K = 3*12 = 36 (3 panels).
    "C1D": (
        "conv1d_nlc",
        {"N": 2, "L": 200, "CI": 12, "CO": 20, "kernel_size": 3, "stride": 2, "padding": 1},
        "NWC",
    ),
    # I = 81 (2 tiles), J = 24 (bn 32), K = 3*3*64 = 576 (36 panels): a K above 512, which
    # left it to dlight's Fallback before the rule.
    "C2D": (
        "conv2d_nhwc",
        {"N": 1, "H": 9, "W": 9, "CI": 64, "CO": 24, "kernel_size": 3, "padding": 1},
        "NHWC",
    ),
    # I = 4*7*7 = 196 (4 tiles), J = 12 (bn 16), K = 27*4 = 108 (7 panels).
    "C3D": (
        "conv3d_ndhwc",
        {"N": 1, "D": 4, "H": 7, "W": 7, "CI": 4, "CO": 12, "kernel_size": 3, "padding": 1},
        "NDHWC",
    ),
    # I = 2*12*12 = 288 (5 tiles), J = 20 (bn 32), K = 9*8 = 72 (5 panels); dilation 2.
    "DIL": (
        "conv2d_nhwc",
        {
            "N": 2,
            "H": 12,
            "W": 12,
            "CI": 8,
            "CO": 20,
            "kernel_size": 3,
            "padding": 2,
            "dilation": 2,
        },
        "NHWC",
    ),
}
