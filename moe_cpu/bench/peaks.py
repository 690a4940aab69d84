"""The machine's compute peaks: the instruction each kernel is made of and its measured rate."""
from __future__ import annotations

from .. import _core, api

# The instruction each kernel's inner loop is made of, by (precision word, ISA word) of its name: a
# scheme's %peak is taken against the register-only peak of that instruction (chain). Kernels with
# no entry (the Eigen reference, Arm, the scalar tile model) have no SIMD peak here. The AMX kernels are
# taken against the tile peak, though experts below amx_min_rows run on their AVX-512 twins.
PEAK_INSN = {
    ("w4a8", "avx512vnni"): "vpdpbusd_zmm", ("w8a8", "avx512vnni"): "vpdpbusd_zmm",
    ("fp8w", "avx512vbmi"): "vdpbf16ps_zmm", ("fp8w", "avx512bf16"): "vdpbf16ps_zmm", ("bf16", "avx512bf16"): "vdpbf16ps_zmm",
    ("w4a8", "avx2vnni"): "vpdpbusd_ymm", ("w8a8", "avx2vnni"): "vpdpbusd_ymm",
    ("w4a8", "avx2"): "maddubs_ymm", ("w8a8", "avx2"): "maddubs_ymm", ("fp8w", "avx2"): "fma_ymm", ("bf16", "avx2"): "fma_ymm",
    ("w4a16", "avx512vnni"): "vpdpwssd_zmm", ("w8a16", "avx512vnni"): "vpdpwssd_zmm",
    ("w4a16", "avx2"): "maddwd_ymm", ("w8a16", "avx2"): "maddwd_ymm",
    # A16 on AMX: two int8 tile products per 16 x 32 x 64 step, the multiply-add rate of tdpbf16ps
    ("w4a16", "amx"): "tdpbf16ps_amx", ("w8a16", "amx"): "tdpbf16ps_amx",
    ("w4a8", "amx"): "tdpbssd_amx", ("w8a8", "amx"): "tdpbssd_amx", ("fp8w", "amx"): "tdpbf16ps_amx", ("bf16", "amx"): "tdpbf16ps_amx",
}


def kernel_isa(kernel: str) -> str:
    """The ISA word of a registered kernel: 'w8a8_avx2_4x16' -> 'avx2', 'w4a8_amx_model_32x32' -> 'amx_model'."""
    return {k["name"]: k["isa"] for k in _core.registered_kernels()}[kernel]


def peak_insn(kernel: str):
    """'w8a8_avx2_4x16' -> 'maddubs_ymm'; None for kernels without a measured peak."""
    return PEAK_INSN.get((kernel.split("_")[0], kernel_isa(kernel)))


def tier() -> str:
    """The ISA tier the kernels chosen now belong to: their ISA words, best first ('avx2', 'reference')."""
    isas = []
    for k in api.cpu_features()["kernels"].values():
        isa = kernel_isa(k)
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
