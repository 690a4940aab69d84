#!/usr/bin/env python3
"""isa_audit.py: fails if ISA code can leak into portable code through the linker (cpp/src/kernels/README.md, "ISA regions").

A function with external linkage (global or weak: inline functions, templates, the standard library's
instantiations) may be defined by several objects, and the linker keeps one copy for all callers. If an object
compiled for AVX-512 supplies that copy, portable code calls AVX-512 code and an older CPU dies of SIGILL.
moe_cpu keeps ISA code in the ISA regions of kernels/isa.h: namespace moe_cpu::kernels::<word>. Checked on
every object file (or static archive member) given:

  flags: an object compiled with ISA flags (-mavx2, -march=haswell, ... read from .GCC.command.line, which
         -frecord-gcc-switches writes) defines no external symbol outside an ISA namespace, except plain
         (non-weak) data;
  code:  no external function outside an ISA namespace contains an instruction above the baseline
         (x86-64: SSE2; AArch64: Armv8.0-A with Advanced SIMD).

usage: isa_audit.py [--objdump OBJDUMP] [--readelf READELF] [--isa-header kernels/isa.h] PATH...
PATH: object files, archives or directories (searched for *.o). Exit status 1 lists each leak; 0 prints a summary.
"""
import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_HEADER = os.path.join(HERE, "..", "cpp", "src", "kernels", "isa.h")

# x86-64 above the baseline (SSE2): VEX / EVEX (every AVX mnemonic starts with v), the registers only AVX,
# AVX-512 and AMX have, AMX, and the non-VEX extensions after SSE2 that GCC emits under their -m flags.
X86_REGS = re.compile(r"%(ymm|zmm|tmm)\d+|%k[0-7]\b")
X86_MNEMONICS = set("""
ldtilecfg sttilecfg tilerelease tilezero tileloadd tileloaddt1 tilestored
andn bextr blsi blsmsk blsr tzcnt bzhi mulx pdep pext rorx sarx shlx shrx lzcnt popcnt movbe crc32 adcx adox
addsubps addsubpd haddps haddpd hsubps hsubpd lddqu movddup movshdup movsldup fisttp
pabsb pabsw pabsd palignr phaddw phaddd phaddsw phsubw phsubd phsubsw pmaddubsw pmulhrsw pshufb psignb psignw psignd
blendpd blendps blendvpd blendvps dppd dpps extractps insertps movntdqa mpsadbw packusdw pblendvb pblendw pcmpeqq
pextrb pextrd pextrq phminposuw pinsrb pinsrd pinsrq pmaxsb pmaxsd pmaxud pmaxuw pminsb pminsd pminud pminuw
pmovsxbw pmovsxbd pmovsxbq pmovsxwd pmovsxwq pmovsxdq pmovzxbw pmovzxbd pmovzxbq pmovzxwd pmovzxwq pmovzxdq
pmuldq pmulld ptest roundpd roundps roundsd roundss pcmpestri pcmpestrm pcmpistri pcmpistrm pcmpgtq
""".split())
# AArch64 above Armv8.0-A: dot products, matrix multiplies, BF16, SVE registers, LSE atomics, RCpc, RDMA.
ARM_MNEMONICS = re.compile(
    r"^(sdot|udot|usdot|sudot|smmla|ummla|usmmla|bfdot|bfmmla|bfmlal[bt]|bfcvtn?2?|sqrdml[as]h|ldapr\w*|fcmla|fcadd|"
    r"fjcvtzs|(ldadd|ldclr|ldeor|ldset|ldsmax|ldsmin|ldumax|ldumin|swp|casp?)(a|l|al)?[bh]?)$")
ARM_REGS = re.compile(r"\bz\d+\.[bhsdq]\b|\bp\d+/[zm]\b")
# Options that do not raise the ISA (the baseline's own -march / -mtune, the ABI).
NEUTRAL_M = re.compile(r"^-m(tune=.*|arch=(x86-64|armv8-a)|abi=.*|little-endian|no-red-zone|fentry)$")
SPECIAL = re.compile(r"^_Z(T[HWVIS]|GV)?")  # TLS init / wrapper, vtable, typeinfo, guard variable


def isa_words(header):
    return sorted(set(re.findall(r"^#define MOE_ISA_TARGET_(\w+)", open(header).read(), re.M)))


def isa_scoped(sym, words):
    """In namespace moe_cpu::kernels::<word> (a member, local static, lambda, guard, vtable, TLS wrapper)."""
    m = SPECIAL.match(sym)
    if not m:
        return False
    rest = sym[m.end():]
    rest = re.sub(r"^Z*N[rVKRO]*", "", rest)  # local entities (Z, nested: a lambda in a lambda), nested name (N) and its qualifiers
    return any(rest.startswith("7moe_cpu7kernels%d%s" % (len(w), w)) for w in words)


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def objects(paths):
    for p in paths:
        if os.path.isdir(p):
            for root, _, files in os.walk(p):
                for f in sorted(files):
                    if f.endswith(".o"):
                        yield os.path.join(root, f)
        else:
            yield p


def members(text):
    """objdump output split per archive member / object: {name: lines}."""
    out, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"^(?:In archive .*:)?\s*$", line)
        h = re.match(r"^(\S.*?):\s+file format (\S+)", line)
        if h:
            cur = h.group(1)
            out[cur] = (h.group(2), [])
        elif cur and not m:
            out[cur][1].append(line)
    return out


def symbols(lines):
    """External symbols defined in one object (objdump -t): {name: (weak, is_function)}."""
    syms = {}
    for line in lines:
        m = re.match(r"^[0-9a-f]+ (.{7}) (\S+)\s+[0-9a-f]+\s+(?:\.hidden\s+|\.internal\s+|\.protected\s+)?(\S+)$", line)
        if not m:
            continue
        flags, section, name = m.groups()
        if section == "*UND*" or section.startswith("*ABS*"):
            continue
        bind = flags[0]  # l local, g global, u unique global, ! both, ' ' neither (weak is flags[1])
        weak = flags[1] == "w"
        if bind not in "gu!" and not weak:
            continue
        syms[name] = (weak or bind == "u", flags[6] == "F")
    return syms


def insn_text(line):
    """The instruction of an objdump -d --no-show-raw-insn line ("   addr:\tinsn")."""
    return line.split("\t")[-1].strip()


def above_baseline(arch, line):
    text = insn_text(line)
    mnem = text.split()[0] if text else ""
    if arch == "x86":
        if X86_REGS.search(text):
            return True
        if mnem.startswith("v") and mnem not in ("verr", "verw"):
            return True
        base = mnem
        if base not in X86_MNEMONICS and base[-1:] in "bwlq":
            base = base[:-1]
        return mnem.startswith("tdp") or base in X86_MNEMONICS
    return bool(ARM_MNEMONICS.match(mnem) or ARM_REGS.search(text))


def isa_flags(readelf, obj_path):
    """The ISA options an object was compiled with (None: not recorded)."""
    try:
        text = run([readelf, "-p", ".GCC.command.line", obj_path])
    except subprocess.CalledProcessError:
        return None
    if "String dump" not in text:  # no such section
        return None
    opts = re.findall(r"\s(-m\S+)", text)
    return sorted({o for o in opts if not NEUTRAL_M.match(o)})


def audit(paths, objdump, readelf, words):
    leaks, n_obj, n_fun, n_isa, unrecorded = [], 0, 0, 0, []
    for path in objects(paths):
        dis = members(run([objdump, "-d", "--no-show-raw-insn", "-w", path]))
        tab = members(run([objdump, "-t", "-w", path]))
        flags = None if path.endswith(".a") else isa_flags(readelf, path)
        if flags is None and not path.endswith(".a"):
            unrecorded.append(path)
        for member, (fmt, lines) in tab.items():
            n_obj += 1
            arch = "arm" if "aarch64" in fmt else "x86"
            syms = symbols(lines)
            # per-function code of this member
            code, cur = {}, None
            for line in dis.get(member, (fmt, []))[1]:
                h = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
                if h:
                    cur = h.group(1)
                    code.setdefault(cur, [])
                elif cur and line.startswith(" "):
                    code[cur].append(line)
            for name, (weak, fn) in sorted(syms.items()):
                if isa_scoped(name, words):
                    n_isa += 1
                    continue
                if flags and (fn or weak):
                    leaks.append((member, name, "compiled with %s, outside an ISA namespace" % " ".join(flags)))
                if fn:
                    n_fun += 1
                    bad = next((i for i in code.get(name, []) if above_baseline(arch, i)), None)
                    if bad:
                        leaks.append((member, name, "above-baseline code outside an ISA namespace: %s" % insn_text(bad)))
    return leaks, n_obj, n_fun, n_isa, unrecorded


def demangle(names):
    try:
        return run(["c++filt"] + list(names)).splitlines()
    except (OSError, subprocess.CalledProcessError):
        return list(names)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objdump", default="objdump")
    ap.add_argument("--readelf", default="readelf")
    ap.add_argument("--isa-header", default=DEFAULT_HEADER)
    ap.add_argument("paths", nargs="+")
    a = ap.parse_args()
    words = isa_words(a.isa_header)
    if not words:
        sys.exit("isa_audit: no MOE_ISA_TARGET_<word> in %s" % a.isa_header)
    leaks, n_obj, n_fun, n_isa, unrecorded = audit(a.paths, a.objdump, a.readelf, words)
    if n_obj == 0:
        sys.exit("isa_audit: no object files under %s" % " ".join(a.paths))
    if leaks:
        names = sorted({s for _, s, _ in leaks})
        pretty = dict(zip(names, demangle(names)))
        for member, sym, why in leaks:
            print("LEAK %s: %s: %s" % (member, pretty[sym], why))
        print("isa_audit: %d leak(s) in %d objects" % (len(leaks), n_obj))
        sys.exit(1)
    note = " (%d without recorded options: flags not checked)" % len(unrecorded) if unrecorded else ""
    print("isa_audit: %d objects, %d external functions outside ISA namespaces at the baseline, %d ISA-namespace "
          "symbols; no leak%s" % (n_obj, n_fun, n_isa, note))


if __name__ == "__main__":
    main()
