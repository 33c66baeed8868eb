"""Which SIMD instructions the integer kernels compile to, on this CPU and on CPUs we do not have.

numba compiles for the host, so the kernels are compiled here once (in a fresh numba cache, so the
LLVM module is in memory) and the same optimised module is then lowered by LLVM for each named
CPU. A host with that CPU builds the same IR (the x86 AVX2 intrinsics are chosen on any AVX2
host), so the counts say what it would run: whether `vpmaddubsw`/`vpmaddwd` stay, and whether
LLVM fuses a multiply-add pair into a VNNI `vpdpwssd`/`vpdpbusd` where the CPU has one.

    python benchmarks/kernel_asm.py [--cpus host,haswell,icelake-server,sapphirerapids,znver4,alderlake]
                                    [--types Q4_0,Q8_0,Q4_K,Q5_K,Q6_K]

On an AVX-512BW host the kernels are compiled with 512-bit multiply-adds
(`intdot.x86_avx512`), which CPUs without AVX-512 cannot lower: those rows are skipped unless
CLOVER_SIMD=avx2 compiles the 256-bit form.

Prints one table row per (kernel, CPU): the count of each integer multiply-add, sign, prefetch and
int-to-float instruction in the kernel's object code, with the widest register each used.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile

CPUS = "host,haswell,icelake-server,sapphirerapids,znver4,alderlake"
AVX512_CPUS = {"skylake-avx512", "cascadelake", "cooperlake", "icelake-client", "icelake-server", "tigerlake",
               "rocketlake", "sapphirerapids", "emeraldrapids", "graniterapids", "znver4", "znver5"}
_PATTERN = re.compile(r"^\s+(?:\{vex\}\s+)?(v\w+|prefetch\w+)\s+([^\n]*)", re.M)
_WANTED = re.compile(r"madd|vpdp|sign|cvtdq2ps|prefetch")


def count(asm: str) -> dict[str, int]:
    """Instruction counts in `asm`, keyed "mnemonic/register width" (e.g. "vpmaddwd/ymm")."""
    counts: collections.Counter[str] = collections.Counter()
    for mnemonic, operands in _PATTERN.findall(asm):
        if _WANTED.search(mnemonic):
            regs = re.findall(r"%([xyz])mm", operands)
            counts[f"{mnemonic}/{regs[-1]}mm" if regs else mnemonic] += 1
    return dict(sorted(counts.items()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpus", default=CPUS, help="LLVM CPU names, comma-separated ('host': this one)")
    p.add_argument("--types", default="Q4_0,Q8_0,Q4_K,Q5_K,Q6_K", help="weight types, comma-separated")
    args = p.parse_args(argv)
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="clover-asm-")  # compile, do not load
    import numpy as np
    from clover_runtime.kernels import prepare
    from clover_runtime.kernels.intdot import x86_avx512
    from clover_runtime.kernels.intmatmul import INT_KERNELS
    from clover_runtime.quants.formats import Q4_0, Q4_K, Q5_K, Q6_K, Q8_0, row_bytes
    from llvmlite import binding as llb

    target = llb.Target.from_default_triple()
    print(f"host CPU: {llb.get_host_cpu_name()}", file=sys.stderr)
    print("| kernel | CPU | instructions |\n|---|---|---|")
    types = {"Q4_0": Q4_0, "Q8_0": Q8_0, "Q4_K": Q4_K, "Q5_K": Q5_K, "Q6_K": Q6_K}
    for name in args.types.split(","):
        ggml_type = types[name]
        raw = np.zeros(row_bytes(ggml_type, 2048) * 64, np.uint8)
        prepare(raw, ggml_type, 64, 2048, 1).matmul(np.ones((1, 2048), np.float32))  # compiles it
        kernel = INT_KERNELS[ggml_type]
        module = llb.parse_assembly(str(kernel.overloads[kernel.signatures[0]].library._final_module))
        for cpu in args.cpus.split(","):
            name_ = llb.get_host_cpu_name() if cpu == "host" else cpu
            if cpu != "host" and x86_avx512() and cpu not in AVX512_CPUS:
                print(f"| {name} | {cpu} | (skipped: compiled with 512-bit instructions; CLOVER_SIMD=avx2) |")
                continue
            machine = target.create_target_machine(cpu=name_, features="", opt=3)
            found = count(machine.emit_assembly(module))
            text = ", ".join(f"`{k}` {v}" for k, v in found.items()) or "(none)"
            print(f"| {name} | {cpu if cpu != 'host' else f'host ({name_})'} | {text} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
