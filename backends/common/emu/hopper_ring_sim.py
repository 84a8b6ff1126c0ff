# hopper_ring_sim.py: a protocol model of the kit Hopper prefill kernel's barriers
# (prefill_hopper.cuh, prefill_hopper_consume.cuh, prefill_hopper_merge.cuh): the producer, the two
# consumer warpgroups, their ping-pong named barriers, Q buffers, K and V rings of their own
# depths and the merged tile boundaries (AP_HOPPER_QBUF 2, the default), with mbarrier phases and
# TMA completions in random order and delay, over random work-tile lists; checks no deadlock,
# that every read sees the tile it expects and that no buffer is overwritten while read. Also
# (3,3,1,off): the one-Q-buffer schedule. With two Q buffers and merged boundaries, as the kernel:
# the producer issues the next loaded tile's Q kQLead K/V tiles before this one's last, writes that
# tile into the Q buffer's TileDesc slot (Bars::desc) between its q_empty wait and its q_full
# arrival, and after its last tile marks the end there with a bare q_full arrival; the consumers'
# lookahead after every tile (next_tile) waits for the next loaded tile's q_full and must read
# exactly that tile (or the end) from the slot. vwarp: the paged source's two producer warps
# (AP_HOPPER_PAGED_VWARP): one issues Q and K (and the end), the other V, each walking the loaded
# tiles and waiting on its own ring's empty barriers. nwg: the consumer warpgroups, 2 or 3 (head dim
# 64 over the ragged source, AP_HOPPER_D64_WG3: the turns go round the three, turn_give). Plain
# Python; meson test kit-hopper-ring-sim.
# Run: python3 backends/common/emu/hopper_ring_sim.py [seeds]
import random, sys

class MBar:
    def __init__(s, count): s.count=count; s.pending=count; s.phase=0; s.tx=0
    def arrive(s):
        s.pending-=1; s._chk()
    def expect_arrive(s, tx): s.tx+=tx; s.pending-=1; s._chk()
    def complete_tx(s, tx): s.tx-=tx; s._chk()
    def _chk(s):
        if s.pending==0 and s.tx==0: s.phase+=1; s.pending=s.count
    def done(s, parity):  # try_wait.parity: true once the phase with that parity completed
        return (s.phase & 1) != parity
class Named:
    def __init__(s): s.arrivals=0; s.gen=0
kQLead=2  # prefill_hopper.cuh's AP_HOPPER_QLEAD
def run(tiles, kStg, kVStg, kQB, merge, seed, vwarp=False, nwg=2):
    rng=random.Random(seed)
    qf=[MBar(1) for _ in range(kQB)]; qe=[MBar(nwg) for _ in range(kQB)]
    kf=[MBar(1) for _ in range(kStg)]; ke=[MBar(nwg) for _ in range(kStg)]
    vf=[MBar(1) for _ in range(kVStg)]; ve=[MBar(nwg) for _ in range(kVStg)]
    qbuf=[None]*kQB; kbuf=[None]*kStg; vbuf=[None]*kVStg
    readers={}  # (kind,idx) -> set of wg reading
    named={1+w:[0,0] for w in range(nwg)}  # id -> [arrivals in current gen, gen]
    pending_tma=[]
    out={}
    desc=[None]*kQB  # Bars::desc: the TileDesc slots (desc_store / desc_load)
    tiledesc = merge and kQB==2
    loaded=[t for t,nb in enumerate(tiles) if nb>0]
    def nb_arrive(i):
        named[i][0]+=1
        if named[i][0]==2: named[i][0]=0; named[i][1]+=1
    def produce_q(t,qn):
        qb=qn%kQB
        while not qe[qb].done(((qn//kQB)&1)^1): yield
        if tiledesc: desc[qb]=t
        qf[qb].expect_arrive(1); pending_tma.append(('q',qb,(t,),qf[qb]))
    def producer():
        ring=0; qn=0; q_done=False
        for j,t in enumerate(loaded):
            nb=tiles[t]; nxt=loaded[j+1] if j+1<len(loaded) else None
            if not q_done: yield from produce_q(t,qn)
            q_at=max(nb-kQLead,0)
            for i in range(nb):
                if tiledesc and nxt is not None and i==q_at: yield from produce_q(nxt,qn+1)
                g=ring+i; s=g%kStg; vs=g%kVStg
                while not ke[s].done(((g//kStg)&1)^1): yield
                kf[s].expect_arrive(1); pending_tma.append(('k',s,(t,i),kf[s]))
                if vwarp: continue  # producer_v issues this V tile
                while not ve[vs].done(((g//kVStg)&1)^1): yield
                vf[vs].expect_arrive(1); pending_tma.append(('v',vs,(t,i),vf[vs]))
            q_done = tiledesc and nxt is not None
            ring+=nb; qn+=1
        if tiledesc:  # the end: a bare arrival on the next Q load's q_full
            qb=qn%kQB
            while not qe[qb].done(((qn//kQB)&1)^1): yield
            desc[qb]='end'; qf[qb].arrive()
    def producer_v():  # the V warp: the same tiles and ring positions, V loads only
        ring=0
        for t in loaded:
            for i in range(tiles[t]):
                g=ring+i; vs=g%kVStg
                while not ve[vs].done(((g//kVStg)&1)^1): yield
                vf[vs].expect_arrive(1); pending_tma.append(('v',vs,(t,i),vf[vs]))
            ring+=tiles[t]
    def hold(wg,kind,idx,expect):
        buf={'q':qbuf,'k':kbuf,'v':vbuf}[kind]
        assert buf[idx]==expect, (wg,kind,idx,buf[idx],expect)
        readers.setdefault((kind,idx),set()).add(wg)
    def unhold(wg,kind,idx,expect):
        buf={'q':qbuf,'k':kbuf,'v':vbuf}[kind]
        assert buf[idx]==expect, ('overwritten while read',wg,kind,idx,buf[idx],expect)
        readers[(kind,idx)].discard(wg)
    def consumer(wg):
        # returns generator; ping-pong: take = sync on 1+wg, give = arrive on the next one's
        # (2-wg for two; 1+(wg+1)%nwg, the kernel's turn_give)
        def take():
            named[1+wg][0]+=1
            gen=named[1+wg][1]
            if named[1+wg][0]==2: named[1+wg][0]=0; named[1+wg][1]+=1
            while named[1+wg][1]==gen: yield
        def give(): nb_arrive(2-wg if nwg==2 else 1+(wg+1)%nwg)
        def wait(bar,par):
            while not bar.done(par): yield
        def lookahead(t,qn_next):
            # next_tile: wait for the next loaded tile's q_full and read its slot: that tile, or
            # the end past the last (the kernel waits before it asks tile_at whether any is left)
            if not tiledesc: return
            qb=qn_next%kQB
            yield from wait(qf[qb],(qn_next//kQB)&1)
            want=next((u for u in loaded if u>t),'end')
            assert desc[qb]==want, ('TileDesc', wg, t, qn_next, desc[qb], want)
        if wg==nwg-1: give_init=nb_arrive(1)
        ring=0; qn=0; primed=False; turns=0
        T=len(tiles)
        for t in range(T):
            nb=tiles[t]
            if nb<0:
                yield from lookahead(t,qn)
                continue
            if nb>0 and not primed:
                qb=qn%kQB
                yield from wait(qf[qb],(qn//kQB)&1); hold(wg,'q',qb,(t,))
                g=ring; s=g%kStg
                yield from wait(kf[s],(g//kStg)&1)
                yield from take(); hold(wg,'k',s,(t,0)); give(); turns+=1
                yield; unhold(wg,'k',s,(t,0)); ke[s].arrive()
                if nb==1: unhold(wg,'q',qb,(t,)); qe[qb].arrive()
            primed=False
            for i in range(1,nb):
                g=ring+i; s=g%kStg; sp=(g-1)%kVStg; qb=qn%kQB
                yield from wait(kf[s],(g//kStg)&1); yield from wait(vf[sp],((g-1)//kVStg)&1)
                yield from take(); hold(wg,'k',s,(t,i)); hold(wg,'v',sp,(t,i-1)); give(); turns+=1
                yield; unhold(wg,'k',s,(t,i)); ke[s].arrive()
                if i==nb-1: unhold(wg,'q',qb,(t,)); qe[qb].arrive()
                yield; unhold(wg,'v',sp,(t,i-1)); ve[sp].arrive()
            yield from lookahead(t, qn+1 if nb>0 else qn)
            nxt = t+1 if t+1<T else None
            if merge and nb>0 and nxt is not None and tiles[nxt]>0:
                nb2=tiles[nxt]; g=ring+nb-1; sp=g%kVStg; g2=ring+nb; s2=g2%kStg; qn2=qn+1; qb2=qn2%kQB
                yield from wait(qf[qb2],(qn2//kQB)&1); hold(wg,'q',qb2,(nxt,))
                yield from wait(kf[s2],(g2//kStg)&1); yield from wait(vf[sp],(g//kVStg)&1)
                yield from take(); hold(wg,'k',s2,(nxt,0)); hold(wg,'v',sp,(t,nb-1)); give(); turns+=1
                yield; unhold(wg,'k',s2,(nxt,0)); ke[s2].arrive()
                if nb2==1: unhold(wg,'q',qb2,(nxt,)); qe[qb2].arrive()
                yield; unhold(wg,'v',sp,(t,nb-1)); ve[sp].arrive()
                out.setdefault(t,[]).append(wg)
                primed=True
            else:
                if nb>0:
                    g=ring+nb-1; sp=g%kVStg
                    yield from wait(vf[sp],(g//kVStg)&1)
                    yield from take(); hold(wg,'v',sp,(t,nb-1)); give(); turns+=1
                    yield; unhold(wg,'v',sp,(t,nb-1)); ve[sp].arrive()
                out.setdefault(t,[]).append(wg)
            if nb>0: ring+=nb; qn+=1
        if wg==0:
            yield from take()
    procs=[producer()]+[consumer(w) for w in range(nwg)]+([producer_v()] if vwarp else [])
    alive=[True]*len(procs); steps=0
    while any(alive):
        steps+=1
        if steps>2_000_000: raise Exception('deadlock? tiles=%s'%tiles)
        # complete a random pending TMA sometimes
        if pending_tma and rng.random()<0.3:
            j=rng.randrange(len(pending_tma)) if rng.random()<0.3 else 0
            kind,idx,tag,bar=pending_tma.pop(j)
            assert not readers.get((kind,idx)), ('TMA into a stage being read',kind,idx)
            {'q':qbuf,'k':kbuf,'v':vbuf}[kind][idx]=tag; bar.complete_tx(1)
            continue
        i=rng.randrange(len(procs))
        if alive[i]:
            try: next(procs[i])
            except StopIteration: alive[i]=False
    assert not pending_tma
    for t,nb in enumerate(tiles):
        if nb>=0: assert sorted(out.get(t,[]))==list(range(nwg)), (t, out.get(t))
    assert all(named[i][0]==0 for i in named), named
    return True
n=0
for seed in range(int(sys.argv[1]) if len(sys.argv)>1 else 300):
    rng=random.Random(seed*7+1)
    tiles=[rng.choice([0,1,1,2,3,4,5,-1]) if rng.random()<0.5 else rng.randint(1,8) for _ in range(rng.randint(1,9))]
    for cfg in [(3,2,2,True),(3,3,2,True),(2,2,2,True),(3,3,1,True),(3,3,1,False),(3,2,2,False)]:
        for vwarp in (False, True):
            run(tiles,*cfg,seed,vwarp); n+=1
    for cfg in [(5,5,2,True),(2,2,2,True),(3,3,1,False)]:  # three consumer warpgroups (D64)
        run(tiles,*cfg,seed,False,3); n+=1
print('ok', n, 'runs')
