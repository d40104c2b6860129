"""Published specifications of the GPUs the cost model prices kernels on.

Every figure is the vendor's, for dense math (a datasheet's "with sparsity" figure halved):
peak throughput per instruction class and input dtype, chip-wide memory bandwidth, L2 size,
SM count and boost clock. The model (:mod:`.physical`) divides chip throughput evenly over the
SMs. A GPU not in the table, or a figure the vendor does not publish, is not guessed: the model
then says it cannot price the kernel (:func:`spec_for`).

Sources (each entry names its own):

* A100: NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB) and the NVIDIA A100 Tensor Core
  GPU Architecture whitepaper (108 SMs, 40 MB L2);
* H100: NVIDIA H100 Tensor Core GPU datasheet (SXM5 and PCIe columns) and the NVIDIA H100
  Tensor Core GPU Architecture whitepaper (132 / 114 SMs, 50 MB L2);
* H200: NVIDIA H200 Tensor Core GPU product page and datasheet (the GH100 of the H100 SXM with
  141 GB HBM3e at 4.8 TB/s);
* L4, L40S: NVIDIA L4 and L40S product pages and datasheets; the Ada Lovelace architecture
  whitepaper for their SM counts and L2;
* B200: NVIDIA HGX B200 platform specifications (8-GPU totals divided by 8); NVIDIA does not
  publish B200's L2 size there, so it is left unknown;
* RTX A6000: NVIDIA RTX A6000 datasheet (84 SMs, 10752 CUDA cores) and the Ampere GA102
  whitepaper (6 MB L2); it is here for the published cuBLAS SGEMM measurements made on it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

__all__ = ["GPU_SPECS", "GPUSpec", "spec_for"]


@dataclass(frozen=True)
class GPUSpec:
    """What the vendor publishes about one GPU, as the cost model uses it.

    Attributes
    ----------
    name : str
        The key of :data:`GPU_SPECS`, which is also its TVM target tag where TVM has one.
    sms : int
    boost_mhz : int
    fp32_tflops : float
        FP32 FMA throughput of the CUDA cores (SIMT), dense.
    tensor_tflops : tuple of (str, float)
        Tensor-core throughput by input dtype (``float16``, ``bfloat16``, ``tf32``, ``int8``
        in TOPS, ``float8``), dense, with fp32 accumulation (given as a dict, kept as sorted
        pairs so that a spec is hashable).
    hbm_gbps : float
        Device memory bandwidth, GB/s.
    l2_mb : float or None
        L2 cache size (None where the vendor does not publish it).
    source : str
    """

    name: str
    sms: int
    boost_mhz: int
    fp32_tflops: float
    tensor_tflops: tuple = ()
    hbm_gbps: float = 0.0
    l2_mb: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.tensor_tflops, dict):
            object.__setattr__(self, "tensor_tflops", tuple(sorted(self.tensor_tflops.items())))

    def at_clock(self, mhz: int) -> GPUSpec:
        """This GPU with its SMs clocked at ``mhz`` instead of the boost clock (a benchmark run
        with locked clocks): math throughput scales with the clock, memory bandwidth does not."""
        scale = mhz / self.boost_mhz
        return replace(
            self,
            boost_mhz=mhz,
            fp32_tflops=self.fp32_tflops * scale,
            tensor_tflops=tuple((k, v * scale) for k, v in self.tensor_tflops),
            source=f"{self.source}; clocked at {mhz} MHz",
        )

    def peak_tflops(self, instruction: str, in_dtype: str) -> float | None:
        """Peak dense throughput of ``instruction`` (``"ffma"``: CUDA cores, ``"mma"``: tensor
        cores) for ``in_dtype`` operands, or None when the vendor publishes none."""
        if instruction == "ffma":
            return self.fp32_tflops
        key = "tf32" if in_dtype == "float32" else in_dtype
        return dict(self.tensor_tflops).get(key)


_A100_SRC = "NVIDIA A100 datasheet (SXM4 80GB, dense); A100 architecture whitepaper (SMs, L2)"
_H100_SRC = "NVIDIA H100 datasheet (dense = sparsity figure / 2); H100 architecture whitepaper"
GPU_SPECS = MappingProxyType(
    {
        "nvidia/nvidia-a100": GPUSpec(
            "nvidia/nvidia-a100", 108, 1410, 19.5,
            {"float16": 312.0, "bfloat16": 312.0, "tf32": 156.0, "int8": 624.0},
            2039.0, 40.0, _A100_SRC,
        ),
        "nvidia/nvidia-h100": GPUSpec(
            "nvidia/nvidia-h100", 132, 1980, 67.0,
            {"float16": 989.4, "bfloat16": 989.4, "tf32": 494.7, "int8": 1978.9,
             "float8": 1978.9},
            3350.0, 50.0, _H100_SRC + " (SXM5)",
        ),
        "nvidia/nvidia-h100-pcie": GPUSpec(
            "nvidia/nvidia-h100-pcie", 114, 1755, 51.0,
            {"float16": 756.5, "bfloat16": 756.5, "tf32": 378.0, "int8": 1513.0,
             "float8": 1513.0},
            2000.0, 50.0, _H100_SRC + " (PCIe)",
        ),
        "nvidia/nvidia-h200": GPUSpec(
            "nvidia/nvidia-h200", 132, 1980, 67.0,
            {"float16": 989.4, "bfloat16": 989.4, "tf32": 494.7, "int8": 1978.9,
             "float8": 1978.9},
            4800.0, 50.0, "NVIDIA H200 datasheet (SXM, dense = sparsity figure / 2)",
        ),
        "nvidia/nvidia-l4": GPUSpec(
            "nvidia/nvidia-l4", 58, 2040, 30.3,
            {"float16": 121.0, "bfloat16": 121.0, "tf32": 60.0, "int8": 242.5, "float8": 242.5},
            300.0, 48.0, "NVIDIA L4 datasheet (dense); Ada Lovelace whitepaper (SMs, L2)",
        ),
        "nvidia/nvidia-l40s": GPUSpec(
            "nvidia/nvidia-l40s", 142, 2520, 91.6,
            {"float16": 362.05, "bfloat16": 362.05, "tf32": 183.0, "int8": 733.0,
             "float8": 733.0},
            864.0, 96.0, "NVIDIA L40S datasheet (dense); Ada Lovelace whitepaper (SMs, L2)",
        ),
        "nvidia/rtx-a6000": GPUSpec(
            "nvidia/rtx-a6000", 84, 1800, 38.7,
            {"float16": 154.8, "bfloat16": 154.8, "tf32": 77.4, "int8": 309.7},
            768.0, 6.0, "NVIDIA RTX A6000 datasheet (dense); GA102 whitepaper (L2)",
        ),
        "nvidia/nvidia-b200": GPUSpec(
            "nvidia/nvidia-b200", 148, 1965, 75.0,
            {"float16": 2250.0, "bfloat16": 2250.0, "tf32": 1100.0, "int8": 4500.0,
             "float8": 4500.0},
            8000.0, None, "NVIDIA HGX B200 specifications (8-GPU totals / 8, dense)",
        ),
    }
)  # fmt: skip
"""Published specifications by TVM target tag (or the tag such a GPU would have)."""


def spec_for(target_or_name) -> GPUSpec | None:
    """The specification of a target (its tag) or of a name of :data:`GPU_SPECS`; None for a
    GPU the table does not hold (the model then cannot price kernels for it)."""
    if target_or_name is None:
        return None
    if isinstance(target_or_name, str):
        return GPU_SPECS.get(target_or_name)
    from .._compat import target_tag

    tag = target_tag(target_or_name)
    return GPU_SPECS.get(tag) if tag else None
