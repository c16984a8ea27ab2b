#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Print Module.symvers lines for the symbols an installed module exports.

    ko-exports.py MODULE.ko[.xz|.zst|.gz] NAME [PREFIX...]

MODULE is an installed kernel module (compressed or not), NAME the module
name written into the lines (e.g. nvidia, ib_uverbs). Only exports whose
name starts with one of the PREFIXes are printed (all when none is given).

A module's exports are its `__ksymtab_<sym>` symbols (every kernel since
2.6 writes one per EXPORT_SYMBOL*). Where the kernel has CONFIG_MODVERSIONS
the module also carries `__crc_<sym>`: an absolute symbol whose value is the
CRC (kernels before 5.19), or a symbol in a `__kcrctab*` section whose 4
bytes there are the CRC (5.19 on). Without it the CRC is 0x00000000, which
is what modpost writes for a kernel without MODVERSIONS.

The export type is EXPORT_SYMBOL_GPL when the ksymtab entry is in
`__ksymtab_gpl` (older kernels), else EXPORT_SYMBOL: newer kernels keep one
__ksymtab, and a GPL module (peermem is one) may use either. Namespaces are
not recovered (neither NVIDIA's nor OFED's exports use one).

Exit status 0 with the lines on stdout (or for --help), 1 with a message on
stderr when the file cannot be read as an ELF module or the arguments are
wrong (a usage line), 2 when it exports nothing matching.
"""
import gzip
import lzma
import struct
import sys


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".xz"):
        return lzma.decompress(data)
    if path.endswith(".gz"):
        return gzip.decompress(data)
    if path.endswith(".zst"):
        try:
            import zstandard  # type: ignore
            return zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 30)
        except ImportError:
            import subprocess
            return subprocess.run(["zstd", "-dc", path], check=True,
                                  stdout=subprocess.PIPE).stdout
    return data


def exports(data):
    """Yield (symbol, crc or None, ksymtab section name)."""
    if data[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    is64 = data[4] == 2
    end = "<" if data[5] == 1 else ">"
    if is64:
        shoff, = struct.unpack_from(end + "Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", data, 0x3A)
        shfmt = end + "IIQQQQIIQQ"
    else:
        shoff, = struct.unpack_from(end + "I", data, 0x20)
        shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", data, 0x2E)
        shfmt = end + "IIIIIIIIII"
    shdrs = []
    for i in range(shnum):
        f = struct.unpack_from(shfmt, data, shoff + i * shentsize)
        # name, type, flags, addr, offset, size, link, info, align, entsize
        shdrs.append(f)
    strtab_off = shdrs[shstrndx][4]

    def cstr(off):
        return data[off:data.index(b"\0", off)].decode("ascii", "replace")

    names = [cstr(strtab_off + s[0]) for s in shdrs]
    symtab = [s for s in shdrs if s[1] == 2]  # SHT_SYMTAB
    if not symtab:
        raise ValueError("no symbol table (stripped module?)")
    st = symtab[0]
    str_off = shdrs[st[6]][4]
    symfmt = end + ("IBBHQQ" if is64 else "IIIBBH")
    ksym = {}
    crcs = {}
    for i in range(st[5] // st[9]):
        raw = struct.unpack_from(symfmt, data, st[4] + i * st[9])
        if is64:
            name_off, _info, _other, shndx, value, _size = raw
        else:
            name_off, value, _size, _info, _other, shndx = raw
        name = cstr(str_off + name_off)
        if name.startswith("__ksymtab_") and 0 < shndx < len(names):
            ksym[name[len("__ksymtab_"):]] = names[shndx]
        elif name.startswith("__crc_"):
            sym = name[len("__crc_"):]
            if shndx == 0xFFF1:  # SHN_ABS: the value is the CRC
                crcs[sym] = value & 0xFFFFFFFF
            elif 0 < shndx < len(shdrs):
                sec = shdrs[shndx]
                # In a relocatable module the value is the offset in its section.
                off = sec[4] + value - sec[3]
                crcs[sym], = struct.unpack_from(end + "I", data, off)
    for sym, sec in sorted(ksym.items()):
        # Kernels before 5.19 have a __ksymtab_strings, not a symbol of it.
        if sym == "strings":
            continue
        yield sym, crcs.get(sym), sec


USAGE = "usage: ko-exports.py MODULE.ko[.xz|.zst|.gz] NAME [PREFIX...] | --help"


def main(argv):
    if len(argv) >= 2 and argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    bad = [a for a in argv[1:] if a.startswith("-")]
    if bad:
        print(f"ko-exports.py: unknown option '{bad[0]}'\n{USAGE}", file=sys.stderr)
        return 1
    if len(argv) < 3:
        print(f"ko-exports.py: want a module file and a module name\n{USAGE}", file=sys.stderr)
        return 1
    path, modname, prefixes = argv[1], argv[2], argv[3:]
    try:
        data = load(path)
        found = list(exports(data))
    except Exception as e:  # unreadable, truncated, compressed wrongly: say so
        print(f"{path}: cannot read its exports: {e}", file=sys.stderr)
        return 1
    n = 0
    for sym, crc, sec in found:
        if prefixes and not any(sym.startswith(p) for p in prefixes):
            continue
        kind = "EXPORT_SYMBOL_GPL" if sec.endswith("_gpl") else "EXPORT_SYMBOL"
        print(f"0x{crc or 0:08x}\t{sym}\t{modname}\t{kind}\t")
        n += 1
    return 0 if n else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
