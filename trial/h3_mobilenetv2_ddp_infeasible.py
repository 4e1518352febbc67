"""Finding h3-3 (typed, but a ddp plan should exist): MobileNetV2 (transformers, default options, image 32,
depth_multiplier 0.25) under axis_roles={"dp": "ddp"} on dp=2 (and fsdp dp=2 x tp=2) is InfeasiblePlanError
at its last 1x1 conv + BatchNorm (output (4, 1280, 1, 1)); tp=2 / tp=3 plans match. Prints plan's verdict,
for MobileNetV2 and for a small conv -> BN stack whose spatial size reaches 1x1."""
import sys, os
sys.path.insert(0, os.path.dirname(__file__))
import torch
import parallelizer


class Small(torch.nn.Module):
    def __init__(self, size):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.BatchNorm2d(8)
        self.c2, self.b2 = torch.nn.Conv2d(8, 16, 1), torch.nn.BatchNorm2d(16)
        self.size = size

    def forward(self, x):
        h = torch.relu(self.b1(self.c1(x)))
        return self.b2(self.c2(h)).mean()


if __name__ == "__main__":
    import h3_models as M
    cases = [("small 2x2 -> 1x1", lambda: (Small(2), (torch.randn(4, 3, 2, 2),), {})),
             ("small 8x8 -> 4x4", lambda: (Small(8), (torch.randn(4, 3, 8, 8),), {}))]
    if "--full" in sys.argv:
        cases.append(("mobilenetv2", lambda: M.build("mobilenetv2")))
    for name, build in cases:
        model, args, kwargs = build()
        try:
            parallelizer.plan(parallelizer.trace(model, args, kwargs), {"dp": 2}, axis_roles={"dp": "ddp"})
            print(name, "planned")
        except Exception as e:
            print(name, f"{type(e).__name__}:", str(e)[:600])
