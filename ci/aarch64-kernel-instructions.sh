#!/usr/bin/env bash
# Instructions per register tile of each aarch64 kernel, counted from the
# release binary's disassembly (llvm-objdump-22): for every kernel function
# the innermost loop that holds its multiply-adds, its length, what it
# does per pass, and multiply-adds per instruction. Emulation says nothing
# about a phone's speed; this says what the compiler emitted, which is what
# a phone would run. Usage: bash ci/aarch64-kernel-instructions.sh [BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-$(bash ci/build-aarch64.sh | tail -n 1)}
objdump=llvm-objdump-22
command -v $objdump >/dev/null || { echo "ci/aarch64-kernel-instructions.sh: $objdump not found (llvm-22; toolchain/install.sh)" >&2; exit 1; }

# kernel: a substring of its demangled symbol, multiply-adds per instruction
# of the kind it issues
kernels=(
    "neon_bfmmla::tile|bfmmla|16"
    "matmul::neon::tiles|fmla|4"
)
for entry in "${kernels[@]}"; do
    IFS='|' read -r pattern op macs <<<"$entry"
    python3 - "$bin" "$pattern" "$op" "$macs" "$objdump" <<'EOF'
import re, subprocess, sys
binary, pattern, op, macs, objdump = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
nm = subprocess.run(["llvm-nm-22", "--defined-only", binary], capture_output=True, text=True, check=True).stdout
raw = [line.split()[-1] for line in nm.splitlines()]
demangled = subprocess.run(["llvm-cxxfilt-22"], input="\n".join(raw), capture_output=True, text=True, check=True).stdout.splitlines()
names = list(zip(raw, demangled))
names = [(raw, nice) for raw, nice in names if pattern in nice]
if not names:
    sys.exit(f"no symbol matching {pattern} in {binary}")
for raw, nice in names:
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", f"--disassemble-symbols={raw}", binary], capture_output=True, text=True, check=True).stdout
    insns = []
    for line in text.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(\S+)\s*(.*)", line)
        if m:
            insns.append((int(m.group(1), 16), m.group(2), m.group(3)))
    index = {a: i for i, (a, _, _) in enumerate(insns)}
    loops = []
    for i, (addr, mnem, args) in enumerate(insns):
        if (mnem.startswith("b") or mnem.startswith("cb") or mnem.startswith("tb")) and mnem not in ("bl", "blr", "br", "bfmmla", "bic", "bif", "bit", "bsl", "bfi", "bfxil"):
            tgt = re.search(r"0x([0-9a-f]+)", args)
            if tgt:
                target = int(tgt.group(1), 16)
                if target <= addr and target in index:
                    body = insns[index[target]:i + 1]
                    count = sum(1 for _, mn, _ in body if mn == op)
                    if count:
                        loops.append((len(body), count, body))
    if not loops:
        print(f"{nice}: no loop with {op}")
        continue
    # innermost loops holding the multiply-adds: none nests another such loop
    def inside(a, b):  # loop a strictly inside loop b
        return a is not b and b[2][0][0] <= a[2][0][0] and a[2][-1][0] <= b[2][-1][0]
    inner = [l for l in loops if not any(inside(o, l) for o in loops)]
    print(nice)
    for length, count, body in sorted(inner, key=lambda l: -l[1]):
        loads = sum(1 for _, mn, _ in body if mn.startswith("ld"))
        print(f"    loop at {body[0][0]:#x}: {length} instructions per pass: {count} {op} ({count * macs} multiply-adds), "
              f"{loads} loads, {length - count - loads} other; {count * macs / length:.1f} multiply-adds per instruction")
EOF
done
