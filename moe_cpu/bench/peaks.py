"""The machine's compute peaks: the instruction each kernel is made of and its measured rate."""
from __future__ import annotations

from .. import _core, api

# The instruction each kernel's inner loop is made of, by (precision word, ISA word) of its name: a
# scheme's %peak is taken against the register-only peak of that instruction (chain). Kernels with
# no entry (the Eigen reference, Arm) have no SIMD peak here.
PEAK_INSN = {
    ("w4a8", "avx512vnni"): "vpdpbusd_zmm", ("w8a8", "avx512vnni"): "vpdpbusd_zmm",
    ("fp8w", "avx512vbmi"): "vdpbf16ps_zmm", ("fp8w", "avx512bf16"): "vdpbf16ps_zmm", ("bf16", "avx512bf16"): "vdpbf16ps_zmm",
    ("w4a8", "avx2vnni"): "vpdpbusd_ymm", ("w8a8", "avx2vnni"): "vpdpbusd_ymm",
    ("w4a8", "avx2"): "maddubs_ymm", ("w8a8", "avx2"): "maddubs_ymm", ("fp8w", "avx2"): "fma_ymm", ("bf16", "avx2"): "fma_ymm",
}


def peak_insn(kernel: str):
    """'w8a8_avx2_4x16' -> 'maddubs_ymm'; None for kernels without a measured peak."""
    parts = kernel.split("_")
    return PEAK_INSN.get((parts[0], parts[1])) if len(parts) > 1 else None


def tier() -> str:
    """The ISA tier the kernels chosen now belong to: their ISA words, best first ('avx2', 'reference')."""
    isas = []
    for k in api.cpu_features()["kernels"].values():
        isa = k.split("_")[1]
        if isa not in isas:
            isas.append(isa)
    return " + ".join(isas)


class Peaks:
    """Instruction peaks of this run, measured once on first use (TOPS: tera int8 ops or flops per s)."""

    def __init__(self, threads):
        self.threads, self.tops = threads, {}
        self.what = {p["name"]: p["what"] for p in _core.peak_instructions()}

    def of(self, kernel):
        insn = peak_insn(kernel)
        if insn is not None and insn not in self.tops:
            self.tops[insn] = _core.instruction_peak_tops(insn, self.threads)
        return insn, (self.tops[insn] if insn else None)
