"""PackedExperts.save / moe_cpu.load_packed: exact round trips, mapping without a copy, and clear
errors for corrupted, truncated, mismatched or foreign files (each bad file loads in a subprocess)."""
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

import moe_cpu
from conftest import SCHEME_CONFIGS, make_input, make_moe, make_routing

pytestmark = pytest.mark.isa   # kernel results: run at every ISA level (scripts/test.sh)

HEADER_CRC_AT = 252


@pytest.mark.parametrize("mmap", [True, False])
@pytest.mark.parametrize("name", ["int4_g32", "int4_g64_zp", "int4_pc", "int8", "int8_g32", "fp8_32x64", "bf16"])
def test_round_trip_is_exact(rng, tmp_path, name, mmap):
    _, w13, _, w2 = make_moe(rng, SCHEME_CONFIGS[name], 3, 128, 64 if name.startswith("int4") else 96)
    w13.save(tmp_path / "w13.moe")
    w2.save(str(tmp_path / "w2.moe"))
    l13, l2 = moe_cpu.load_packed(tmp_path / "w13.moe", mmap=mmap), moe_cpu.load_packed(tmp_path / "w2.moe", mmap=mmap)
    for a, b in ((w13, l13), (w2, l2)):
        assert (a.scheme, a.num_experts, a.out_features, a.in_features, a.group_size, a.block_size, a.has_zeros, a.nbytes) == \
               (b.scheme, b.num_experts, b.out_features, b.in_features, b.group_size, b.block_size, b.has_zeros, b.nbytes)
        for key, arr in a.unpack_quantized().items():
            got = b.unpack_quantized()[key]
            assert (arr is None and got is None) or np.array_equal(arr, got), key
    x = make_input(rng, 9, 128)
    tw, ids = make_routing(rng, 9, 3, 2)
    np.testing.assert_array_equal(moe_cpu.fused_experts(x, w13, w2, tw, ids), moe_cpu.fused_experts(x, l13, l2, tw, ids))


def test_mmap_maps_the_file_instead_of_copying(rng, tmp_path):
    _, w13, _, _ = make_moe(rng, SCHEME_CONFIGS["int8"], 2, 64, 64)
    path = tmp_path / "mapped.moe"
    w13.save(path)
    mapped = moe_cpu.load_packed(path, mmap=True)
    maps = open("/proc/self/maps").read()
    assert str(path) in maps                     # the weights are the file's pages
    copied = moe_cpu.load_packed(path, mmap=False)
    del mapped
    assert str(path) not in open("/proc/self/maps").read()   # the copy keeps no mapping
    assert copied.nbytes == w13.nbytes


def test_header_and_section_checksums_are_crc32(rng, tmp_path):
    _, w13, _, _ = make_moe(rng, SCHEME_CONFIGS["int4_g32"], 2, 64, 64)
    path = tmp_path / "w.moe"
    w13.save(path)
    data = path.read_bytes()
    assert data[:8] == b"MOECPUPK"
    assert struct.unpack_from("<I", data, HEADER_CRC_AT)[0] == zlib.crc32(data[:HEADER_CRC_AT])
    offset, size, crc = struct.unpack_from("<QQI", data, 72)   # section 0: qweight
    assert offset % 4096 == 0 and zlib.crc32(data[offset:offset + size]) == crc


def _edit(data: bytes, at: int, fmt: str, value) -> bytes:
    """Write `value` into the header and fix the header checksum, so only the edited field is wrong."""
    b = bytearray(data)
    struct.pack_into(fmt, b, at, value)
    struct.pack_into("<I", b, HEADER_CRC_AT, zlib.crc32(bytes(b[:HEADER_CRC_AT])))
    return bytes(b)


BAD_FILES = {
    "truncated": (lambda d: d[: len(d) // 2], "truncated"),
    "shorter_than_header": (lambda d: d[:100], "shorter than the header"),
    "bad_magic": (lambda d: b"NOTMOE!!" + d[8:], "bad magic"),
    "corrupted_header": (lambda d: d[:30] + bytes([d[30] ^ 1]) + d[31:], "header checksum"),
    "corrupted_weights": (lambda d: d[:5000] + bytes([d[5000] ^ 0x10]) + d[5001:], "qweight checksum"),
    "future_version": (lambda d: _edit(d, 8, "<I", 6), "version 6"),
    "act_block_of_1024": (lambda d: _edit(_edit(d, 8, "<I", 5), 211, "<B", 32), "invalid header (activation block 1024)"),
    "act_block_not_dividing_k": (lambda d: _edit(_edit(d, 8, "<I", 5), 211, "<B", 8), "act_block = 256"),
    "unknown_layout": (lambda d: _edit(d, 20, "<I", 99), "layout 99"),
    "shape_mismatch": (lambda d: _edit(d, 24, "<q", 5), "bytes but the header's shapes need"),
    "bad_scheme": (lambda d: _edit(d, 16, "<I", 7), "invalid header"),
    "a16_scheme_in_version_3": (lambda d: _edit(d, 16, "<I", 4), "invalid header"),
    "zero_experts": (lambda d: _edit(d, 24, "<q", 0), "invalid shapes"),
}


@pytest.mark.parametrize("label", sorted(BAD_FILES))
def test_bad_files_raise_clear_errors(rng, tmp_path, label):
    _, w13, _, _ = make_moe(rng, SCHEME_CONFIGS["int4_g32"], 2, 64, 64)
    good = tmp_path / "good.moe"
    w13.save(good)
    mangle, needle = BAD_FILES[label]
    bad = tmp_path / "bad.moe"
    bad.write_bytes(mangle(good.read_bytes()))
    code = ("import moe_cpu\n"
            "try:\n"
            f"    moe_cpu.load_packed({str(bad)!r})\n"
            "except ValueError as e:\n"
            "    print('RAISED', e)\n"
            "else:\n"
            "    print('LOADED')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, f"crashed: {out.returncode} {out.stderr[-500:]}"
    assert out.stdout.startswith("RAISED") and needle in out.stdout, out.stdout


def test_corrupted_weights_load_without_verify_and_missing_paths_raise(rng, tmp_path):
    _, w13, _, _ = make_moe(rng, SCHEME_CONFIGS["int8"], 2, 64, 64)
    path = tmp_path / "w.moe"
    w13.save(path)
    data = bytearray(path.read_bytes())
    data[5000] ^= 1
    path.write_bytes(bytes(data))
    assert moe_cpu.load_packed(path, verify=False).num_experts == 2   # the caller opted out of the CRC pass
    with pytest.raises(ValueError, match="checksum"):
        moe_cpu.load_packed(path)
    with pytest.raises(ValueError, match="cannot be opened"):
        moe_cpu.load_packed(tmp_path / "missing.moe")
    with pytest.raises(ValueError, match="cannot be opened for writing"):
        w13.save(tmp_path / "no_such_dir" / "w.moe")
