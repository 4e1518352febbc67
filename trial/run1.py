from trial.h6a import report
import sys
if __name__ == "__main__":
    specs = []
    for sch in ["gpipe", "1f1b", "interleaved_1f1b", "zbv", "dualpipev", "bitpipe"]:
        specs.append({"name": f"stack-mlp pp2dp2 {sch}", "mesh": {"pp": 2, "dp": 2},
                      "opts": {"schedule": sch, "microbatches": 4, "axis_roles": {"dp": "ddp"}}})
    report(specs[: int(sys.argv[1]) if len(sys.argv) > 1 else None])
