from trial.h6a import report
import sys
PD = {"pp": 2, "dp": 2}; PT = {"pp": 2, "tp": 2}; P4 = {"pp": 4}; DT = {"dp": 2, "tp": 2}
def pp(sch, m=4, roles=None):
    o = {"schedule": sch, "microbatches": m}
    if roles: o["axis_roles"] = roles
    return o
SPECS = [
 {"name": "DROPOUT attn p.1 pp2dp2 1f1b", "block": "attn", "pad": True, "p": 0.1, "mesh": PD, "opts": pp("1f1b", roles={"dp": "ddp"})},
 {"name": "DROPOUT attn p.1 pp2dp2 bitpipe", "block": "attn", "pad": True, "p": 0.1, "mesh": PD, "opts": pp("bitpipe", roles={"dp": "ddp"})},
 {"name": "DROPOUT attn p.1 dp2tp2 ddp+tp", "block": "attn", "pad": True, "p": 0.1, "mesh": DT, "opts": {"axis_roles": {"dp": "ddp", "tp": "tp"}}},
 {"name": "DROPOUT gpt2 p.1 pp2dp2 zbv", "model": "gpt2", "p": 0.1, "mesh": PD, "opts": pp("zbv", roles={"dp": "ddp"})},
 {"name": "bn dp2tp2 ddp+tp", "block": "bn", "mesh": DT, "opts": {"axis_roles": {"dp": "ddp", "tp": "tp"}}},
 {"name": "bn dp2tp2 fsdp+tp", "block": "bn", "mesh": DT, "opts": {"axis_roles": {"dp": "fsdp", "tp": "tp"}}},
 {"name": "ema dp2tp2 fsdp+tp", "block": "ema", "mesh": DT, "opts": {"axis_roles": {"dp": "fsdp", "tp": "tp"}}},
 {"name": "bn pp2dp2 bitpipe (refuse?)", "block": "bn", "mesh": PD, "opts": pp("bitpipe", roles={"dp": "ddp"})},
 {"name": "ema pp2tp2 bitpipe (refuse?)", "block": "ema", "mesh": PT, "opts": pp("bitpipe", roles={"tp": "tp"})},
 {"name": "bn m1 pp2dp2 gpipe m=2 (per-mb stats)", "block": "bn", "mesh": PD, "opts": pp("gpipe", m=2, roles={"dp": "ddp"})},
 {"name": "ce_weighted dp2tp2 ddp+tp", "loss": "ce_weighted", "mesh": DT, "opts": {"axis_roles": {"dp": "ddp", "tp": "tp"}}},
 {"name": "ce_smooth dp2tp2 fsdp+tp", "loss": "ce_smooth", "mesh": DT, "opts": {"axis_roles": {"dp": "fsdp", "tp": "tp"}}},
 {"name": "ce_zloss dp2tp2 fsdp+tp", "loss": "ce_zloss", "mesh": DT, "opts": {"axis_roles": {"dp": "fsdp", "tp": "tp"}}},
]
if __name__ == "__main__":
    sel = sys.argv[1] if len(sys.argv) > 1 else ""
    report([s for s in SPECS if sel in s["name"]])
