#!/usr/bin/env python3
"""ncu_lines.py: where a kernel's warps stall, by source line.

ncu's source page gives stall samples per SASS instruction; this maps each instruction to the
CUDA source line it came from (nvdisasm's line table of the same build's cubin) and adds them up:
share of all samples, warp instructions executed, the three largest stall reasons, per line and
for the top single instructions. It also reports the kernel's executed code footprint (distinct
instructions run at least once, 16 bytes each), which instruction-fetch stalls depend on.

    # on the GPU machine (the report's source page as CSV)
    ncu --section SourceCounters --section WarpStateStats -k regex:NAME -o r BINARY ...
    ncu --import r.ncu-rep --page source --csv --print-source sass | gzip > src.csv.gz
    # then, on the same machine, the built plugin itself (its cubins by cuobjdump -xelf, each
    # disassembled by nvdisasm -gi: the code that ran, line tables included with -lineinfo)
    python3 bench/ncu_lines.py src.csv.gz build/backends/NAME/ap_NAME.so [--top 20] [--depth N]
    # or a cubin, or nvdisasm's text of one (nvdisasm -gi -c k.cubin > k.dis), built here

The function is the one of the disassembly whose opcodes match the CSV's at every offset; none
matching means the cubin is not the profiled build, and the script says so (exit 1).
Used for bench/results/2026-11-28-h200-f.md. `--self-test` checks the parsing on a made-up pair.
"""
import argparse
import collections
import csv
import gzip
import io
import os
import re
import subprocess
import sys
import tempfile

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
LINE_RE = re.compile(
    r'//## File "(?:[^"]*/)?([^/"]+)", line (\d+)(?: inlined at "(?:[^"]*/)?([^/"]+)", line (\d+))?')
INSN_RE = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
FUNC_RE = re.compile(r"^\s*\.text\.(\S+):")


def opcode(text):
    """The mnemonic of a SASS instruction without its predicate and modifiers."""
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def read_csv(text):
    """(kernel name, rows as dicts with offset from the function's first instruction)."""
    rows = list(csv.reader(io.StringIO(text)))
    if len(rows) < 3 or rows[0][:1] != ["Kernel Name"]:
        raise ValueError("not ncu's source page as CSV (`--page source --csv --print-source sass`)")
    header = rows[1]
    for need in ("Address", "Source", SAMPLES, EXECUTED):
        if need not in header:
            raise ValueError("the CSV has no column '%s'" % need)
    out = []
    for r in rows[2:]:
        if len(r) != len(header):
            continue
        d = dict(zip(header, r))
        d["addr"] = int(d["Address"], 16)
        out.append(d)
    if not out:
        raise ValueError("the CSV lists no instruction")
    base = min(d["addr"] for d in out)
    for d in out:
        d["offset"] = d["addr"] - base
    return rows[0][1], header, out


def read_disasm(text):
    """{function: {offset: (instruction text, [file:line, its caller, ...])}}: the source line of
    each instruction and, where nvdisasm gives them (-gi: one line a level; -g: the outermost
    inlined-at site), the sites it was inlined at, innermost first."""
    funcs, cur, chain, fresh = {}, None, ["?"], True
    for line in text.splitlines():
        m = FUNC_RE.match(line)
        if m:
            cur = funcs.setdefault(m.group(1), {})
            chain, fresh = ["?"], True
            continue
        m = LINE_RE.search(line)
        if m:
            if fresh:
                chain, fresh = [], False
            site = "%s:%s" % (m.group(1), m.group(2))
            if not chain or chain[-1] != site:
                chain.append(site)
            if m.group(3):
                chain.append("%s:%s" % (m.group(3), m.group(4)))
            continue
        m = INSN_RE.match(line)
        if m and cur is not None:
            fresh = True
            cur[int(m.group(1), 16)] = (m.group(2), chain)
    return funcs


def pick_function(rows, funcs):
    """The function whose opcode at every profiled offset is the CSV's, or None."""
    for name, code in funcs.items():
        if all(d["offset"] in code and opcode(code[d["offset"]][0]) == opcode(d["Source"])
               for d in rows):
            return name
    return None


def num(s):
    try:
        return float(s)
    except ValueError:
        return 0.0


def report(text_csv, text_dis, top, depth, out):
    kernel, header, rows = read_csv(text_csv)
    funcs = read_disasm(text_dis)
    name = pick_function(rows, funcs)
    if name is None:
        out.write("no function of the disassembly matches the profiled SASS of %s: "
                  "not the same build?\n" % kernel)
        return 1
    code = funcs[name]
    reasons = [h for h in header if h.startswith("stall_") and "(Not Issued)" not in h]
    total = sum(num(d[SAMPLES]) for d in rows) or 1.0
    by_line = collections.defaultdict(lambda: [0.0, 0.0, collections.Counter()])
    for d in rows:
        key = " < ".join(code[d["offset"]][1][:depth + 1])
        acc = by_line[key]
        acc[0] += num(d[SAMPLES])
        acc[1] += num(d[EXECUTED])
        for h in reasons:
            acc[2][h[len("stall_"):]] += num(d[h])
    ran = sum(1 for d in rows if num(d[EXECUTED]) > 0)
    out.write("%s\n  %d instructions, %d executed (%d bytes of code run), %d samples\n"
              % (kernel, len(rows), ran, ran * 16, int(total)))
    out.write("\nshare  executed   line: top stall reasons (share of the line's samples)\n")
    for key, (s, e, rc) in sorted(by_line.items(), key=lambda kv: -kv[1][0])[:top]:
        why = ", ".join("%s %.0f%%" % (k, 100 * v / s) for k, v in rc.most_common(3) if v > 0)
        out.write("%5.1f%% %9d   %s: %s\n" % (100 * s / total, e, key, why))
    out.write("\nshare  offset  instruction (line)\n")
    for d in sorted(rows, key=lambda d: -num(d[SAMPLES]))[:top]:
        text, chain = code[d["offset"]]
        out.write("%5.1f%% %6x  %s (%s)\n" % (100 * num(d[SAMPLES]) / total, d["offset"], text[:60],
                                             " < ".join(chain)))
    return 0


def self_test():
    """A made-up two-function disassembly and a CSV of the second: the right function is picked,
    the samples land on their lines, and a CSV of other code is refused."""
    dis = "\n".join([
        "\t.text._Z5otherv:",
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;",
        "        /*0010*/                   EXIT ;",
        "\t.text._Z6kernelv:",
        '\t//## File "/x/k.cu", line 10',
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;",
        '\t//## File "/x/m.cuh", line 3 inlined at "/x/k.cu", line 12',
        '\t//## File "/x/k.cu", line 12 inlined at "/x/k.cu", line 20',
        "        /*0010*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;",
        "        /*0020*/              @!P0 BRA 0x10 ;",
        '\t//## File "/x/k.cu", line 14',
        "        /*0030*/                   EXIT ;",
    ])
    head = ["Address", "Source", SAMPLES, EXECUTED, "stall_wait", "stall_long_sb",
            "stall_wait (Not Issued)"]

    def csv_of(lines):
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["Kernel Name", "kernel()"])
        w.writerow(head)
        for r in lines:
            w.writerow(r)
        return buf.getvalue()

    good = csv_of([["0x7f00", "MOV R1, c[0x0][0x28]", "1", "4", "1", "0", "0"],
                   ["0x7f10", "HMMA.16816.F32.BF16 R4, R8, R12, R4", "6", "40", "2", "4", "1"],
                   ["0x7f20", "@!P0 BRA 0x7f10", "3", "40", "0", "3", "0"],
                   ["0x7f30", "EXIT", "0", "0", "0", "0", "0"]])
    out = io.StringIO()
    assert report(good, dis, 10, 0, out) == 0, out.getvalue()
    text = out.getvalue()
    assert "4 instructions, 3 executed (48 bytes of code run), 10 samples" in text, text
    assert " 90.0%        80   m.cuh:3: long_sb 78%, wait 22%" in text, text
    assert " 10.0%         4   k.cu:10: wait 100%" in text, text
    out = io.StringIO()
    assert report(good, dis, 10, 2, out) == 0
    text = out.getvalue()
    assert " 90.0%        80   m.cuh:3 < k.cu:12 < k.cu:20: long_sb" in text, text
    assert "(m.cuh:3 < k.cu:12 < k.cu:20)" in text, text
    bad = csv_of([["0x100", "FADD R1, R2, R3", "1", "1", "1", "0", "0"]])
    out = io.StringIO()
    assert report(bad, dis, 10, 0, out) == 1 and "not the same build" in out.getvalue()
    try:
        read_csv("a,b\n")
        raise AssertionError("a CSV without ncu's header was read")
    except ValueError:
        pass
    print("ncu_lines self-test: ok")
    return 0


def disasm_text(path):
    """nvdisasm -gi's text of a cubin, of every cubin in an ELF with embedded device code (a
    plugin .so, by cuobjdump -xelf), or the file itself when it is text already."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"\x7fELF":
        with open(path) as f:
            return f.read()
    nvdisasm = os.environ.get("NVDISASM", "nvdisasm")
    cuobjdump = os.environ.get("CUOBJDUMP", "cuobjdump")
    if path.endswith(".cubin"):
        return subprocess.run([nvdisasm, "-gi", "-c", path], check=True, capture_output=True,
                              text=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([cuobjdump, "-xelf", "all", os.path.abspath(path)], cwd=tmp, check=True,
                       capture_output=True)
        cubins = sorted(n for n in os.listdir(tmp) if n.endswith(".cubin"))
        if not cubins:
            raise ValueError("%s holds no cubin" % path)
        return "\n".join(disasm_text(os.path.join(tmp, n)) for n in cubins)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", nargs="?", help="ncu --page source --csv --print-source sass (.gz too)")
    ap.add_argument("disasm", nargs="?",
                    help="the built .so, a cubin, or nvdisasm -gi -c text of the same code")
    ap.add_argument("--top", type=int, default=20, help="rows of each table (20)")
    ap.add_argument("--depth", type=int, default=0,
                    help="key lines by this many of their inlined-at sites too (nvdisasm -gi)")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if not a.csv or not a.disasm:
        ap.error("the CSV and the disassembly are both needed")
    opener = gzip.open if a.csv.endswith(".gz") else open
    with opener(a.csv, "rt") as f:
        text_csv = f.read()
    try:
        text_dis = disasm_text(a.disasm)
    except (OSError, subprocess.CalledProcessError) as e:
        print("ncu_lines: cannot disassemble %s: %s" % (a.disasm, e), file=sys.stderr)
        return 2
    except ValueError as e:
        print("ncu_lines: %s" % e, file=sys.stderr)
        return 2
    try:
        return report(text_csv, text_dis, a.top, a.depth, sys.stdout)
    except ValueError as e:
        print("ncu_lines: %s" % e, file=sys.stderr)
        return 2
    except BrokenPipeError:  # piped into head
        return 0


if __name__ == "__main__":
    sys.exit(main())
