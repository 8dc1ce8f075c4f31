"""The bottom layer of fakequant's Python: the numeric constants and range rules
(read from the compiled library, so that Python cannot drift from the kernels),
the block-scale formats, argument validation (each rule written once), and the
per-thread export state. Everything else in fakequant imports from here; this package imports
nothing of fakequant but the compiled library (and fakequant/_moved.py, for an old path).
"""
from .constants import (
    AMAX_EPSILON,
    BLOCK_FLOAT_FORMATS,
    E2M1_MAX,
    E4M3_MAX,
    E5M2_MAX,
    FLOAT_FORMAT_MAX,
    FLOAT_FORMATS,
    FP8_FORMATS,
    GGML_BLOCK_TYPES,
    MAX_NUM_BITS,
    MIN_NUM_BITS,
    amax_bound,
    amax_range,
    float_format_max,
    min_max_levels,
)
from .formats import BlockScales
from .numerics import divide, divide_into, zero_keeping_sign
from .errors import TypeAndAttributeError, TypeAndValueError, ValueAndRuntimeError
from .export_state import (
    ExportOptions,
    TranslationError,
    export_options,
    current_export_options,
    enable_onnx_export,
    onnx_export_enabled,
    set_onnx_export_enabled,
    supplying_translations,
    set_symbolic_lowerings,
    lower_symbolically,
    refuse_untranslated,
    exporting,
    dynamo_exporting,
    flag_on,
)
from .validation import (
    check_bool,
    check_float,
    check_fp8_format,
    check_int,
    check_integer_num_bits,
    check_num_bits,
    check_tensor,
    is_int,
    normalize_axis,
    resolve_axes,
)
