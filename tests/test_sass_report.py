"""tools/sass_report.py's reading of cuobjdump's SASS (make sass runs it on the CUDA build):
the hot loop, the widths of its accesses and the slow-path calls it counts apart, on a
hand-written listing in cuobjdump's format."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))

import sass_report  # noqa: E402

LISTING = """
	code for sm_90
		Function : _Z6kernelPKfPfi
	.headerflags	@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
        /*0010*/                   S2R R0, SR_TID.X ;                     /* 0x0000000000007919 */
        /*0020*/                   LDG.E.U16 R2, desc[UR4][R6.64] ;       /* 0x0000000406027981 */
        /*0030*/                   LDG.E.128.CONSTANT R8, desc[UR4][R4.64] ;  /* 0x0000000404087981 */
        /*0040*/                   MUFU.RCP R3, R12 ;                     /* 0x0000000c00037308 */
        /*0050*/                   FCHK P0, R8, R12 ;                     /* 0x0000000c08007302 */
        /*0060*/              @!P0 BRA 0x90 ;                             /* 0x0000000000088947 */
        /*0070*/                   MOV R14, 0x90 ;                        /* 0x0000009000007802 */
        /*0080*/                   CALL.REL.NOINC 0x100 ;                 /* 0x0000007000007944 */
        /*0090*/                   FMUL R8, R8, R3 ;                      /* 0x0000000308087220 */
        /*00a0*/                   NOP ;                                  /* 0x0000000000007918 */
        /*00b0*/                   STG.E.128 desc[UR4][R6.64], R8 ;       /* 0x0000000806007986 */
        /*00c0*/                   STG.E.U8 desc[UR4][R6.64], R2 ;        /* 0x0000000206007986 */
        /*00d0*/               @P1 BRA 0x30 ;                             /* 0xffffff5000001947 */
        /*00e0*/                   STG.E desc[UR4][R6.64], R2 ;           /* 0x0000000206007986 */
        /*00f0*/                   EXIT ;                                 /* 0x000000000000794d */
        /*0100*/                   RET.REL.NODEC R14 0x0 ;                /* 0x0000000000007950 */
"""


def test_the_hot_loop_and_its_counts():
    (f,) = sass_report.parse_sass(LISTING)
    assert f.name == "kernel(float const*, float*, int)"
    assert sass_report.loops(f) == [(3, 13)]
    body = sass_report.hot_loop(f)
    assert [i.address for i in (body[0], body[-1])] == [0x30, 0xD0]
    c = sass_report.count(body)
    # 11 instructions but the NOP; the MOV and CALL of the division's slow path apart
    assert c["with_slow_calls"] == 10 and c["instructions"] == 8
    assert c["loads"] == {"LDG.E.128.CONSTANT": 1}
    assert c["stores"] == {"STG.E.128": 1, "STG.E.U8": 1}
    assert c["loads_ahead"] == 1  # (the U16 load is narrower than the loop's widest)
    assert [sass_report.access_width(op) for op in ("LDG.E.128.CONSTANT", "LDG.E.U16", "STG.E", "STG.E.64")] == \
        [16, 2, 4, 8]


def test_every_kernel_it_reports_is_named_by_one_pattern_per_generation():
    labels = [k.label for k in sass_report.KERNELS]
    assert len(labels) == len(set(labels))
    assert all(k.patterns and all(elements >= 1 for _, elements in k.patterns) for k in sass_report.KERNELS)


# A warp shuffle's divergent path: BRA.DIV jumps out of the loop to a copy of the shuffle, and an
# unconditional BRA returns into the loop's middle; that return is no loop.
DIVERGENT = """
	code for sm_90
		Function : _Z6kernelPKfPfi
	.headerflags	@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
        /*0010*/                   LDG.E.128.CONSTANT R8, desc[UR4][R4.64] ;  /* 0x0000000404087981 */
        /*0020*/                   STG.E.128 desc[UR4][R6.64], R8 ;       /* 0x0000000806007986 */
        /*0030*/                   BRA.DIV UR7, 0xa0 ;                    /* 0x0000000607007947 */
        /*0040*/                   SHFL.DOWN PT, R2, R2, 0x1, 0x1f ;      /* 0x08201f0002027f89 */
        /*0050*/                   LDG.E.128.CONSTANT R12, desc[UR4][R4.64] ;  /* 0x0000000404087981 */
        /*0060*/                   STG.E.128 desc[UR4][R6.64], R12 ;      /* 0x0000000806007986 */
        /*0070*/                   STG.E.U8 desc[UR4][R6.64], R2 ;        /* 0x0000000206007986 */
        /*0080*/              @!P1 BRA 0x10 ;                             /* 0xffffff5000001947 */
        /*0090*/                   EXIT ;                                 /* 0x000000000000794d */
        /*00a0*/                   SHFL.DOWN P2, R2, R2, R3, R4 ;         /* 0x08000017141 */
        /*00b0*/                   BRA 0x50 ;                             /* 0xfffffff400e */
"""


def test_a_return_from_a_divergent_shuffle_is_no_loop():
    (f,) = sass_report.parse_sass(DIVERGENT)
    assert sass_report.loops(f) == [(1, 8)]
    body = sass_report.hot_loop(f)
    assert [i.address for i in (body[0], body[-1])] == [0x10, 0x80]
    assert sass_report.count(body)["loads"] == {"LDG.E.128.CONSTANT": 2}


def test_loads_ahead_counts_the_widest_loads_between_stores_and_calls():
    def ins(op):
        return sass_report.Instruction(0, "", op, "")

    wide, narrow, store = "LDG.E.128.CONSTANT", "LDG.E.U8.CONSTANT", "STG.E.128"
    # two in a row (a narrow load between them does not break the run), then one, then three
    body = [ins(wide), ins(narrow), ins(wide), ins(store), ins(wide), ins("CALL.REL.NOINC"), ins(wide),
            ins(wide), ins("FFMA"), ins(wide), ins(store)]
    assert sass_report.loads_ahead(body) == 3
    assert sass_report.loads_ahead([ins(wide), ins(store)] * 4) == 1
