"""contract.h's quotient_of, the division of the CUDA kernels by a scale whose reciprocal
they make once, against the correctly rounded division (tests/divisor_check.cpp, built with
the host compiler: the FMAs and roundings are IEEE's on both): the same quotient, or both tiny
with the same sign, and the same bits from every element rule; and divider.h's division of
indices by a multiply (Divider32) against the integer division."""
import struct

import pytest

from native_check import build, run, run_each


@pytest.fixture(scope="module")
def divisor_check(tmp_path_factory):
    return build(tmp_path_factory, "divisor_check")


def test_quotient_of_sampled(divisor_check):
    # 258 divisors, 200,000 random dividends each and 38,432 near the grids' rounding
    # boundaries: 61.5 million quotients in a few seconds.
    assert run(divisor_check, "sampled", 200000, 20261127) == 258 * (200000 + 1201 * 4 * 8)


@pytest.mark.slow  # 2^32 dividends a divisor: about half a minute each (a core each)
def test_quotient_of_every_dividend(divisor_check):
    # 0.3 (no short binary expansion), an NVFP4 block scale (E4M3's 1.375 * 2^-3 times the
    # per-tensor scale of an amax of 0.731: 0.731 / (6 * 448)) and the largest fast divisor
    assert run_each(divisor_check, "every", "0.3", repr(0.171875 * 0.731 / 2688), "0x1p60") == 3 * 2**32


def test_block_scales_by_divisors(divisor_check):
    # blockwise_scale with the launch's Divisors of elem_max and g (the CUDA vector kernels'
    # fast trips) against div_rn's: 8 element bounds, 26 per-tensor scales, 20,000 amax each
    # (log-uniform and random bit patterns), E4M3 and float32 scales
    assert run(divisor_check, "scales", 20000, 20261128) == 8 * 26 * 2 * 20000


def test_inside_the_saturation_limit(divisor_check):
    # every float32 between each small float format's max and its saturation limit, both
    # signs: the rounding without saturation and the element without the mask test (the
    # vector kernels' trips of blocks inside the limit) give the full rule's bits
    def floats_between(lo, hi):
        return struct.unpack("<I", struct.pack("<f", hi))[0] - struct.unpack("<I", struct.pack("<f", lo))[0] - 1

    limits = [(6.0, 7.0), (28.0, 30.0), (7.5, 7.75), (448.0, 464.0), (57344.0, 61440.0)]  # (max, limit)
    assert run(divisor_check, "inside") == sum(2 * floats_between(m, limit) + 5 for m, limit in limits)


def test_index_divider_sampled(divisor_check):
    # divider.h's Divider32 (the CUDA per-channel lookup's row and channel): 57 divisors,
    # 100,000 random n each and up to 100,000 multiples of d with both neighbours
    assert run(divisor_check, "integers", 100000, 20261127) == 9754716


@pytest.mark.slow  # 2^31 dividends a divisor: a few seconds each
def test_index_divider_every_dividend(divisor_check):
    assert run_each(divisor_check, "every-integer", 3, 41, 1000003, 2**31 - 1) == 4 * 2**31
