"""Find the parts of a tiled GPU reduction that Stream-K rewrites. Pure: never mutates IR.

- :mod:`.site`: what the analysis finds (:class:`StreamKSite`, :class:`WriteBack`) and the
  condition names of its refusals;
- :mod:`.tiled_reduction`: :func:`analyze` and the site searches built on it;
- :mod:`.tensor_core`: MMA update blocks, tensorized or marked for tensorization;
- :mod:`.blocks`: queries over blocks (paths, reads, writes, names);
- :mod:`.ragged`: a grouped GEMM's ragged views and tile space;
- :mod:`.flops`: the work of an unscheduled kernel;
- :mod:`.tile_shape`: what one tile of a scheduled kernel writes;
- :mod:`.gemm_axes`: a reduction's axes as a GEMM's, and which reductions are depthwise.
- :mod:`.reduction_order`: whether a thread walks K ascending, and in panels how deep.
"""

from .blocks import (
    blockized_parent,
    blocks_under,
    find_block_path,
    function_of,
    is_reduction,
    sblock_rv,
)
from .gemm_axes import GemmAxes, gemm_axes, is_depthwise
from .ragged import (
    COND_RAGGED,
    RAGGED_ATTR,
    RAGGED_SCOPE,
    RaggedReduction,
    RaggedSpace,
    ragged_views,
)
from .site import (
    COND_ACCUMULATOR,
    COND_ATOMIC,
    COND_BAND,
    COND_BLOCK,
    COND_EPILOGUE,
    COND_PANEL,
    COND_REDUCTION,
    COND_RUNTIME_TILES,
    COND_WRITEBACK,
    FRAGMENT_SCOPES,
    REGISTER_SCOPES,
    StreamKSite,
    WriteBack,
)
from .tile_shape import writeback_tile_shape
from .tiled_reduction import analyze, analyze_block, first_site, refusals

__all__ = [
    "COND_ACCUMULATOR",
    "COND_ATOMIC",
    "COND_BAND",
    "COND_BLOCK",
    "COND_EPILOGUE",
    "COND_PANEL",
    "COND_RAGGED",
    "COND_REDUCTION",
    "COND_RUNTIME_TILES",
    "COND_WRITEBACK",
    "FRAGMENT_SCOPES",
    "GemmAxes",
    "RAGGED_ATTR",
    "RAGGED_SCOPE",
    "REGISTER_SCOPES",
    "RaggedReduction",
    "RaggedSpace",
    "StreamKSite",
    "WriteBack",
    "analyze",
    "analyze_block",
    "blockized_parent",
    "blocks_under",
    "find_block_path",
    "first_site",
    "function_of",
    "gemm_axes",
    "ragged_views",
    "is_depthwise",
    "is_reduction",
    "refusals",
    "sblock_rv",
    "writeback_tile_shape",
]
