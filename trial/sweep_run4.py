"""4-rank subset: dp=2 x tp=2 with random costs and with fsdp x tp roles."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_run

NAMES = ["loss:CrossEntropyLoss_w_ls:mean", "loss:CrossEntropyLoss_ignore_w:mean", "loss:CrossEntropyLoss_soft_ls:mean",
         "loss:NLLLoss_ignore:mean", "loss:MultiMarginLoss_p2_w:mean", "loss:KLDivLoss:mean", "loss:BCEWithLogitsLoss_pw:mean",
         "loss:MultiLabelMarginLoss:mean", "loss:TripletMarginLoss:mean", "loss:CosineEmbeddingLoss:none",
         "loss:PoissonNLLLoss_full:sum", "loss:HingeEmbeddingLoss:mean",
         "op:linalg.det", "op:linalg.inv", "op:linalg.eigh", "op:linalg.svdvals", "op:fft.fft2", "op:fft.irfft",
         "op:cdist", "op:grid_sample", "op:special.logsumexp_dim1", "op:distnv_mvn", "op:distnv_categorical_pg",
         "MHA_kdim_vdim", "TDL_prenorm_gelu_mask", "LSTM_bi_2l", "GroupNorm", "Fold_overlap", "EmbeddingBag_max",
         "AdaptiveLogSoftmaxWithLoss", "Bilinear", "InstanceNorm1d_affine_track", "PixelUnshuffle", "Upsample_bicubic"]
CONFIGS = [("rand_dp2tp2", {"dp": 2, "tp": 2}, {}, 13), ("fsdp2xtp2", {"dp": 2, "tp": 2}, {"dp": "fsdp", "tp": "tp"}, None)]

if __name__ == "__main__":
    sweep_run.main(NAMES, sys.argv[1], chunk=24, configs=CONFIGS)
