#!/usr/bin/env python3
"""Host emulation of the FP8 kernel's V transposer (sk98_transpose<HD, BN>,
src/cuda/attention/fwd_sm90_fp8_transposer.cuh) at HD 64 / 128 and BN 64 /
128, run before any GPU run of the blocks-of-64 kernels (docs/perf/fp8.md,
"Blocks of 64"): every thread's loads from a V stage as TMA writes it
(128B / 64B swizzle by row width) and its stores into the Vt stage, then
the Vt stage read as the wgmma B operand (swizzled rows of BN bytes) must
hold, at position pos of dim row r, V[key_of_pos(pos)][r]; every Vt byte
written once; and the bank conflicts of each store instruction (32 lanes).
Expected output: Vt correct at all four shapes; stores conflict-free at
BN 64 (the per-lane row order), 2-way at BN 128 (as documented).

    python3 docs/perf/records/fp8/blocks64_transpose_emu.py
"""
def sw_off(row, col, rowbytes):
    if rowbytes == 128: return row*128 + ((((col>>4) ^ (row & 7))) << 4) + (col & 15)
    assert rowbytes == 64
    return row*64 + ((((col>>4) ^ ((row>>1) & 3))) << 4) + (col & 15)
def key_of_pos(pos):
    chunk = pos & ~31; h=(pos>>4)&1; t=(pos>>2)&3; i=pos&3
    return chunk + 16*h + (2*t+i if i<2 else 8+2*t+i-2)
def run(HD, BN):
    V = bytearray(BN*HD); val = {}
    for k in range(BN):
        for d in range(HD):
            V[sw_off(k, d, HD)] = (k*7 + d*13) & 255; val[(k,d)] = (k*7+d*13)&255
    Vt = [None]*(HD*BN)
    J = HD//32; KK = BN//32
    stores = {}  # (w, j, kk, e) -> list of addresses by lane
    for w in range(2):
        for lane in range(32):
            t = lane & 3; h=(lane>>2)&1; bl = lane>>3; sw = bl>>1
            xs = [((e ^ sw)*64 + ((h ^ (2*(bl&1) + (e>>1))) << 4)) if BN==64 else ((h ^ (4*(bl&1)+e)) << 4) for e in range(4)]
            for j in range(J):
                c16 = J*w + j; d = 16*c16 + 4*bl; key0 = 16*h + 2*t
                if HD == 128:
                    a0 = key0*128 + ((c16 ^ (2*t)) << 4) + 4*bl
                    a1 = (key0+1)*128 + ((c16 ^ (2*t+1)) << 4) + 4*bl
                else:
                    a0 = key0*64 + ((c16 ^ t) << 4) + 4*bl; a1 = a0 + 64
                for kk in range(KK):
                    words = []
                    for a in (a0 + kk*32*HD, a1 + kk*32*HD, a0 + kk*32*HD + 8*HD, a1 + kk*32*HD + 8*HD):
                        words.append(bytes(V[a:a+4]))
                    # out_e byte i = byte e of word i
                    out = [bytes(words[i][e] for i in range(4)) for e in range(4)]
                    row = d*BN + 4*t; kx = 32*kk
                    for e in range(4):
                        if BN == 64:
                            addr = row + (xs[e] ^ kx); data = out[e ^ sw]
                        else:
                            addr = row + e*128 + (xs[e] ^ kx); data = out[e]
                        stores.setdefault((w,j,kk,e), []).append(addr)
                        for i in range(4):
                            assert Vt[addr+i] is None, "double write"
                            Vt[addr+i] = data[i]
    # check Vt as the wgmma operand: row r (dim), position pos (byte) at sw_off(r, pos, BN)
    for r in range(HD):
        for pos in range(BN):
            got = Vt[sw_off(r, pos, BN)]
            exp = val[(key_of_pos(pos), r)]
            assert got == exp, (HD, BN, r, pos, got, exp)
    worst = 0
    for addrs in stores.values():
        banks = {}
        for a in addrs: banks.setdefault((a//4)%32, set()).add(a//4)
        worst = max(worst, max(len(s) for s in banks.values()))
    print(f"HD {HD} BN {BN}: Vt correct; worst store conflict {worst}-way")
for HD in (64, 128):
    for BN in (64, 128):
        run(HD, BN)
