"""The integer kernels compile to the integer SIMD instructions RESULTS.md names (x86 AVX2 hosts).

Runs benchmarks/kernel_asm.py in a fresh process (a fresh numba cache: cached code cannot be
inspected) for two kernel families and reads its table.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from clover_runtime.kernels.intdot import vnni, x86_avx2, x86_avx512
from clover_runtime.system_info import cpu_features

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "kernel_asm.py"


@pytest.mark.skipif(not x86_avx2(), reason="the named instructions are x86 AVX2 ones")
def test_integer_kernels_use_the_avx2_multiply_adds_on_this_host() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--cpus", "host,znver4", "--types", "Q8_0,Q4_K"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): line
            for line in out.splitlines() if line.startswith("| Q")}
    host = {kernel: line for (kernel, cpu), line in rows.items() if cpu.startswith("host")}
    assert set(host) == {"Q8_0", "Q4_K"}
    cpu_vnni = bool({"avx512_vnni", "avx_vnni"} & set(cpu_features()))
    wide = "zmm" if x86_avx512() else "ymm"  # two (sub-)blocks per 512-bit multiply-add
    # K-quant sums of four are one vpdpbusd on AVX-512 VNNI hosts (`intdot.vnni`), else two steps
    fours = "`vpdpbusd/zmm`" if vnni() else f"`vpmaddubsw/{wide}`"
    for kernel, line in host.items():
        assert (fours if kernel == "Q4_K" else f"`vpmaddubsw/{wide}`") in line
        assert f"`vpmaddwd/{wide}`" in line and "`vcvtdq2ps/ymm`" in line
        assert "`prefetcht1`" in line  # the weight stream is fetched ahead into L2 (intdot.PREFETCH_BYTES)
        if not cpu_vnni:  # on a VNNI host LLVM may fuse vpmaddwd and its add into vpdpwssd
            assert "vpdp" not in line
    assert "`vpsignb/ymm`" in host["Q8_0"]  # signed weights: the sign trick before vpmaddubsw
    assert fours in rows[("Q4_K", "znver4")]  # the same IR lowered for an AVX-512 CPU
