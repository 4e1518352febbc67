from trial.h6a import report
import sys
PD = {"pp": 2, "dp": 2}; PT = {"pp": 2, "tp": 2}; P4 = {"pp": 4}; DT = {"dp": 2, "tp": 2}
DDP = {"dp": "ddp"}; TP = {"tp": "tp"}
def pp(mesh, sch, m=4, roles=None, **kw):
    o = {"schedule": sch, "microbatches": m}
    if roles: o["axis_roles"] = roles
    o.update(kw); return o
SPECS = [
 {"name": "attn-pad pp2dp2 1f1b", "block": "attn", "pad": True, "mesh": PD, "opts": pp(PD, "1f1b", roles=DDP)},
 {"name": "attn-pad pp2tp2 zbv", "block": "attn", "pad": True, "mesh": PT, "opts": pp(PT, "zbv", roles=TP)},
 {"name": "attn-pad pp4 interleaved m8", "block": "attn", "pad": True, "n": 8, "mesh": P4, "opts": pp(P4, "interleaved_1f1b", m=8)},
 {"name": "attn-pad dp2tp2 fsdp+tp", "block": "attn", "pad": True, "mesh": DT, "opts": {"axis_roles": {"dp": "fsdp", "tp": "tp"}}},
 {"name": "attn-pad dp2tp2 ddp+tp", "block": "attn", "pad": True, "mesh": DT, "opts": {"axis_roles": {"dp": "ddp", "tp": "tp"}}},
 {"name": "tied pp4 gpipe", "tied": True, "mesh": P4, "opts": pp(P4, "gpipe")},
 {"name": "tied pp2tp2 dualpipev", "tied": True, "mesh": PT, "opts": pp(PT, "dualpipev", roles=TP)},
 {"name": "tied pp2dp2 bitpipe", "tied": True, "mesh": PD, "opts": pp(PD, "bitpipe", roles=DDP)},
 {"name": "frozen b0,b3 pp2dp2 1f1b", "freeze": ["blocks.0", "blocks.3"], "mesh": PD, "opts": pp(PD, "1f1b", roles=DDP)},
 {"name": "frozen b0,emb pp4 zbv", "freeze": ["blocks.0", "emb"], "n": 8, "mesh": P4, "opts": pp(P4, "zbv")},
 {"name": "frozen b1 dp2tp2 fsdp+tp", "freeze": ["blocks.1"], "mesh": DT, "opts": {"axis_roles": {"dp": "fsdp", "tp": "tp"}}},
 {"name": "groups+sched+clip pp2tp2 interleaved", "groups": True, "sched": True, "clip": 0.05, "mesh": PT, "opts": pp(PT, "interleaved_1f1b", roles=TP)},
 {"name": "groups+sched+clip pp4 bitpipe", "groups": True, "sched": True, "clip": 0.05, "n": 8, "mesh": P4, "opts": pp(P4, "bitpipe", m=8)},
 {"name": "groups+clip dp2tp2 fsdp+tp adamw", "groups": True, "clip": 0.05, "optim": "adamw", "mesh": DT, "opts": {"axis_roles": {"dp": "fsdp", "tp": "tp"}}},
 {"name": "accum2 pp2dp2 zbv", "accum": 2, "mesh": PD, "opts": pp(PD, "zbv", roles=DDP)},
 {"name": "accum2 dp2tp2 ddp+tp", "accum": 2, "mesh": DT, "opts": {"axis_roles": {"dp": "ddp", "tp": "tp"}}},
 {"name": "adamw pp4 dualpipev", "optim": "adamw", "n": 8, "mesh": P4, "opts": pp(P4, "dualpipev", m=8)},
 {"name": "m8 pp2dp2 1f1b (mb=1 over dp2)", "mesh": PD, "opts": pp(PD, "1f1b", m=8, roles=DDP)},
 {"name": "m2 pp2dp2 gpipe", "mesh": PD, "opts": pp(PD, "gpipe", m=2, roles=DDP)},
 {"name": "gpt2 own pp2dp2 1f1b m4", "model": "gpt2", "own": True, "mesh": PD, "opts": pp(PD, "1f1b", roles=DDP)},
 {"name": "gpt2 own pp2tp2 zbv m8", "model": "gpt2", "own": True, "mesh": PT, "opts": pp(PT, "zbv", m=8, roles=TP)},
 {"name": "gpt2 fn pp4 bitpipe", "model": "gpt2", "mesh": P4, "opts": pp(P4, "bitpipe")},
 {"name": "llama own pp4 gpipe m8", "model": "llama", "own": True, "mesh": P4, "opts": pp(P4, "gpipe", m=8)},
 {"name": "llama fn pp2tp2 dualpipev", "model": "llama", "mesh": PT, "opts": pp(PT, "dualpipev", roles=TP)},
 {"name": "llama own dp2tp2 fsdp+tp", "model": "llama", "own": True, "mesh": DT, "opts": {"axis_roles": {"dp": "fsdp", "tp": "tp"}}},
 {"name": "bert own pp2dp2 interleaved", "model": "bert", "own": True, "mesh": PD, "opts": pp(PD, "interleaved_1f1b", roles=DDP)},
 {"name": "bert fn pp2tp2 1f1b", "model": "bert", "mesh": PT, "opts": pp(PT, "1f1b", roles=TP)},
 {"name": "bert own dp2tp2 ddp+tp", "model": "bert", "own": True, "mesh": DT, "opts": {"axis_roles": {"dp": "ddp", "tp": "tp"}}},
]
if __name__ == "__main__":
    sel = sys.argv[1] if len(sys.argv) > 1 else ""
    report([s for s in SPECS if sel in s["name"]])
