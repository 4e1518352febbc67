"""Cases of `nn_sweep.py` (a systematic sweep): torch.nn layers, losses, linalg/special/fft/distributions between Linears.
build(name) -> (model, (x, y)); the model returns a scalar loss."""
import math
import torch
import torch.nn as nn
import torch.nn.functional as F

N = 4          # batch
D = 16         # input features


class Sandwich(nn.Module):
    """lin1 -> view(N, *shape) -> mid -> flatten -> lin2 -> mse."""
    def __init__(self, mid, shape, fn=None, extra=None):
        super().__init__()
        self.shape = tuple(shape)
        self.lin1 = nn.Linear(D, math.prod(shape))
        self.mid = mid
        self.fn = fn
        with torch.no_grad():
            out = self._mid(torch.randn(N, *shape))
        self.lin2 = nn.Linear(out[0].numel(), 8)

    def _mid(self, h):
        out = self.fn(self.mid, h) if self.fn is not None else self.mid(h)
        if isinstance(out, (tuple, list)):
            out = out[0]
        return out

    def forward(self, x, y):
        h = self.lin1(x).view(x.shape[0], *self.shape)
        h = self._mid(h)
        return F.mse_loss(self.lin2(h.reshape(x.shape[0], -1)), y)


def sw(mid, shape, fn=None):
    return lambda: Sandwich(mid(), shape, fn)


def _pos(m, h):   # positive input for e.g. LPPool / sqrt
    return m(h.abs() + 0.1)


L3 = (4, 8)            # (C, L)
L4 = (4, 4, 4)         # (C, H, W)
L5 = (2, 4, 4, 4)      # (C, D, H, W)
S3 = (6, 8)            # (T, E) sequences, batch first

LAYERS = {
    "AdaptiveAvgPool1d": sw(lambda: nn.AdaptiveAvgPool1d(3), L3),
    "AdaptiveAvgPool2d": sw(lambda: nn.AdaptiveAvgPool2d((3, 2)), L4),
    "AdaptiveAvgPool3d": sw(lambda: nn.AdaptiveAvgPool3d(3), L5),
    "AdaptiveMaxPool1d": sw(lambda: nn.AdaptiveMaxPool1d(3), L3),
    "AdaptiveMaxPool2d": sw(lambda: nn.AdaptiveMaxPool2d((3, 2)), L4),
    "AdaptiveMaxPool3d": sw(lambda: nn.AdaptiveMaxPool3d(3), L5),
    "AvgPool1d": sw(lambda: nn.AvgPool1d(3, 2, padding=1, count_include_pad=False), L3),
    "AvgPool2d": sw(lambda: nn.AvgPool2d(3, 2, padding=1, ceil_mode=True), L4),
    "AvgPool3d": sw(lambda: nn.AvgPool3d(2), L5),
    "BatchNorm1d": sw(lambda: nn.BatchNorm1d(4), L3),
    "BatchNorm2d": sw(lambda: nn.BatchNorm2d(4), L4),
    "BatchNorm3d": sw(lambda: nn.BatchNorm3d(2), L5),
    "CELU": sw(lambda: nn.CELU(0.7), (12,)),
    "ChannelShuffle": sw(lambda: nn.ChannelShuffle(2), L4),
    "CircularPad1d": sw(lambda: nn.CircularPad1d((2, 1)), L3),
    "CircularPad2d": sw(lambda: nn.CircularPad2d(1), L4),
    "CircularPad3d": sw(lambda: nn.CircularPad3d(1), L5),
    "ConstantPad1d": sw(lambda: nn.ConstantPad1d((2, 1), 0.5), L3),
    "ConstantPad2d": sw(lambda: nn.ConstantPad2d(1, -1.0), L4),
    "ConstantPad3d": sw(lambda: nn.ConstantPad3d(1, 0.3), L5),
    "Conv1d": sw(lambda: nn.Conv1d(4, 6, 3, padding=1, groups=2), L3),
    "Conv1d_dil_stride": sw(lambda: nn.Conv1d(4, 4, 3, stride=2, dilation=2, padding_mode="reflect", padding=2), L3),
    "Conv2d": sw(lambda: nn.Conv2d(4, 6, 3, padding="same"), L4),
    "Conv2d_circular": sw(lambda: nn.Conv2d(4, 4, 3, padding=1, padding_mode="circular", groups=4), L4),
    "Conv3d": sw(lambda: nn.Conv3d(2, 3, 3, padding=1), L5),
    "ConvTranspose1d": sw(lambda: nn.ConvTranspose1d(4, 6, 3, stride=2, output_padding=1), L3),
    "ConvTranspose2d": sw(lambda: nn.ConvTranspose2d(4, 2, 3, stride=2, groups=2), L4),
    "ConvTranspose3d": sw(lambda: nn.ConvTranspose3d(2, 2, 2, stride=2), L5),
    "CosineSimilarity": sw(lambda: nn.CosineSimilarity(dim=1), (2, 12), lambda m, h: m(h[:, 0], h[:, 1])),
    "CrossMapLRN2d": sw(lambda: nn.CrossMapLRN2d(3), L4),
    "ELU": sw(lambda: nn.ELU(), (12,)),
    "Flatten": sw(lambda: nn.Flatten(1, 2), L4),
    "Fold": sw(lambda: nn.Fold((4, 4), 2, stride=2), (8, 4)),
    "Fold_overlap": sw(lambda: nn.Fold((3, 3), 2), (8, 4)),
    "GELU_tanh": sw(lambda: nn.GELU("tanh"), (12,)),
    "GLU": sw(lambda: nn.GLU(-1), (12,)),
    "GLU_dim1": sw(lambda: nn.GLU(1), L3),
    "GroupNorm": sw(lambda: nn.GroupNorm(2, 4), L4),
    "GroupNorm_1d": sw(lambda: nn.GroupNorm(2, 4, affine=False), L3),
    "Hardshrink": sw(lambda: nn.Hardshrink(0.3), (12,)),
    "Hardsigmoid": sw(lambda: nn.Hardsigmoid(), (12,)),
    "Hardswish": sw(lambda: nn.Hardswish(), (12,)),
    "Hardtanh": sw(lambda: nn.Hardtanh(-0.5, 0.5), (12,)),
    "Identity": sw(lambda: nn.Identity(), (12,)),
    "InstanceNorm1d": sw(lambda: nn.InstanceNorm1d(4), L3),
    "InstanceNorm1d_affine_track": sw(lambda: nn.InstanceNorm1d(4, affine=True, track_running_stats=True), L3),
    "InstanceNorm2d_affine": sw(lambda: nn.InstanceNorm2d(4, affine=True), L4),
    "InstanceNorm2d_track": sw(lambda: nn.InstanceNorm2d(4, track_running_stats=True), L4),
    "InstanceNorm3d": sw(lambda: nn.InstanceNorm3d(2, affine=True), L5),
    "LPPool1d": sw(lambda: nn.LPPool1d(2, 2), L3, _pos),
    "LPPool2d": sw(lambda: nn.LPPool2d(3, 2), L4, _pos),
    "LPPool3d": sw(lambda: nn.LPPool3d(2, 2), L5, _pos),
    "LayerNorm": sw(lambda: nn.LayerNorm(8), S3),
    "LayerNorm_2d_nobias": sw(lambda: nn.LayerNorm((6, 8), bias=False), S3),
    "LeakyReLU": sw(lambda: nn.LeakyReLU(0.2), (12,)),
    "Linear_nobias": sw(lambda: nn.Linear(8, 10, bias=False), S3),
    "LocalResponseNorm": sw(lambda: nn.LocalResponseNorm(3), L4),
    "LocalResponseNorm_1d": sw(lambda: nn.LocalResponseNorm(2), L3),
    "LogSigmoid": sw(lambda: nn.LogSigmoid(), (12,)),
    "LogSoftmax": sw(lambda: nn.LogSoftmax(-1), S3),
    "LogSoftmax_dim1": sw(lambda: nn.LogSoftmax(1), S3),
    "MaxPool1d": sw(lambda: nn.MaxPool1d(3, 2, padding=1), L3),
    "MaxPool2d": sw(lambda: nn.MaxPool2d(2, ceil_mode=True, dilation=1), L4),
    "MaxPool3d": sw(lambda: nn.MaxPool3d(2), L5),
    "MaxUnpool1d": sw(lambda: nn.MaxUnpool1d(2), L3, lambda m, h: m(*F.max_pool1d(h, 2, return_indices=True))),
    "MaxUnpool2d": sw(lambda: nn.MaxUnpool2d(2), L4, lambda m, h: m(*F.max_pool2d(h, 2, return_indices=True))),
    "MaxUnpool3d": sw(lambda: nn.MaxUnpool3d(2), L5, lambda m, h: m(*F.max_pool3d(h, 2, return_indices=True))),
    "Mish": sw(lambda: nn.Mish(), (12,)),
    "PReLU_shared": sw(lambda: nn.PReLU(), L3),
    "PReLU_channel": sw(lambda: nn.PReLU(4), L3),
    "PReLU_channel4d": sw(lambda: nn.PReLU(4, 0.1), L4),
    "PairwiseDistance": sw(lambda: nn.PairwiseDistance(p=3.0, keepdim=True), (2, 12), lambda m, h: m(h[:, 0], h[:, 1])),
    "PixelShuffle": sw(lambda: nn.PixelShuffle(2), (8, 2, 2)),
    "PixelUnshuffle": sw(lambda: nn.PixelUnshuffle(2), L4),
    "RMSNorm": sw(lambda: nn.RMSNorm(8), S3),
    "RMSNorm_2d_eps": sw(lambda: nn.RMSNorm((6, 8), eps=1e-3, elementwise_affine=False), S3),
    "ReLU6": sw(lambda: nn.ReLU6(), (12,)),
    "ReflectionPad1d": sw(lambda: nn.ReflectionPad1d((2, 1)), L3),
    "ReflectionPad2d": sw(lambda: nn.ReflectionPad2d(1), L4),
    "ReflectionPad3d": sw(lambda: nn.ReflectionPad3d(1), L5),
    "ReplicationPad1d": sw(lambda: nn.ReplicationPad1d((2, 1)), L3),
    "ReplicationPad2d": sw(lambda: nn.ReplicationPad2d(1), L4),
    "ReplicationPad3d": sw(lambda: nn.ReplicationPad3d(1), L5),
    "SELU": sw(lambda: nn.SELU(), (12,)),
    "SiLU": sw(lambda: nn.SiLU(), (12,)),
    "Sigmoid": sw(lambda: nn.Sigmoid(), (12,)),
    "Softmax": sw(lambda: nn.Softmax(-1), S3),
    "Softmax2d": sw(lambda: nn.Softmax2d(), L4),
    "Softmin": sw(lambda: nn.Softmin(1), S3),
    "Softplus": sw(lambda: nn.Softplus(2.0, 1.0), (12,)),
    "Softshrink": sw(lambda: nn.Softshrink(0.2), (12,)),
    "Softsign": sw(lambda: nn.Softsign(), (12,)),
    "Tanhshrink": sw(lambda: nn.Tanhshrink(), (12,)),
    "Threshold": sw(lambda: nn.Threshold(0.1, -2.0), (12,)),
    "Unflatten": sw(lambda: nn.Unflatten(1, (2, 6)), (12,)),
    "Unfold": sw(lambda: nn.Unfold(2, dilation=1, padding=1, stride=2), L4),
    "Upsample_nearest": sw(lambda: nn.Upsample(scale_factor=2), L4),
    "Upsample_bilinear_ac": sw(lambda: nn.Upsample(scale_factor=1.5, mode="bilinear", align_corners=True), L4),
    "Upsample_bicubic": sw(lambda: nn.Upsample(size=(5, 3), mode="bicubic"), L4),
    "Upsample_linear": sw(lambda: nn.Upsample(scale_factor=2, mode="linear"), L3),
    "Upsample_trilinear": sw(lambda: nn.Upsample(scale_factor=2, mode="trilinear"), L5),
    "Upsample_nearest_exact": sw(lambda: nn.Upsample(scale_factor=1.5, mode="nearest-exact"), L4),
    "UpsamplingBilinear2d": sw(lambda: nn.UpsamplingBilinear2d(scale_factor=2), L4),
    "UpsamplingNearest2d": sw(lambda: nn.UpsamplingNearest2d(size=6), L4),
    "ZeroPad1d": sw(lambda: nn.ZeroPad1d((2, 1)), L3),
    "ZeroPad2d": sw(lambda: nn.ZeroPad2d((1, 0, 2, 1)), L4),
    "ZeroPad3d": sw(lambda: nn.ZeroPad3d(1), L5),
    "RReLU": sw(lambda: nn.RReLU(), (12,)),
    "FractionalMaxPool2d": sw(lambda: nn.FractionalMaxPool2d(2, output_size=3), L4),
    # sequence modules
    "MHA_bf_noweights": sw(lambda: nn.MultiheadAttention(8, 2, batch_first=True), S3,
                            lambda m, h: m(h, h, h, need_weights=False)),
    "MHA_weights_avg": sw(lambda: nn.MultiheadAttention(8, 2, batch_first=True), S3,
                          lambda m, h: m(h, h, h, need_weights=True)[1]),
    "MHA_weights_perhead": sw(lambda: nn.MultiheadAttention(8, 2, batch_first=True), S3,
                              lambda m, h: m(h, h, h, need_weights=True, average_attn_weights=False)[1]),
    "MHA_seqfirst_causal": sw(lambda: nn.MultiheadAttention(8, 2), S3,
                              lambda m, h: m(h, h, h, attn_mask=torch.triu(torch.full((h.shape[0], h.shape[0]), float("-inf")), 1))),
    "MHA_kpm": sw(lambda: nn.MultiheadAttention(8, 2, batch_first=True, bias=False, add_bias_kv=True), S3,
                  lambda m, h: m(h, h, h, key_padding_mask=torch.arange(h.shape[1]).expand(h.shape[0], -1) >= 4)),
    "MHA_kdim_vdim": sw(lambda: nn.MultiheadAttention(8, 2, batch_first=True, kdim=4, vdim=6, add_zero_attn=True), S3,
                        lambda m, h: m(h, h[..., :4], h[..., 2:], need_weights=False)),
    "MHA_bool_mask": sw(lambda: nn.MultiheadAttention(8, 4, batch_first=True), S3,
                        lambda m, h: m(h, h, h, attn_mask=torch.ones(6, 6, dtype=torch.bool).triu(1), is_causal=True)),
    "TEL_post_relu": sw(lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), S3),
    "TEL_prenorm_gelu": sw(lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu",
                                                              batch_first=True, norm_first=True), S3),
    "TEL_mask": sw(lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), S3,
                   lambda m, h: m(h, src_mask=nn.Transformer.generate_square_subsequent_mask(6), is_causal=True)),
    "TransformerEncoder2": sw(lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                                                            2, norm=nn.LayerNorm(8), enable_nested_tensor=False), S3),
    "TDL_post": sw(lambda: nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True), S3,
                   lambda m, h: m(h, h.flip(1))),
    "TDL_prenorm_gelu_mask": sw(lambda: nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True,
                                                                   activation="gelu"), S3,
                                lambda m, h: m(h, h * 2, tgt_mask=nn.Transformer.generate_square_subsequent_mask(6))),
    "TransformerDecoder2": sw(lambda: nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 2),
                              S3, lambda m, h: m(h, h)),
    "Transformer_full": sw(lambda: nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True), S3,
                           lambda m, h: m(h, h[:, :4])),
    "LSTM": sw(lambda: nn.LSTM(8, 6, batch_first=True), S3),
    "LSTM_bi_2l": sw(lambda: nn.LSTM(8, 6, 2, batch_first=True, bidirectional=True), S3),
    "LSTM_proj": sw(lambda: nn.LSTM(8, 6, proj_size=3), S3),
    "LSTM_hn": sw(lambda: nn.LSTM(8, 6, batch_first=True, bidirectional=True), S3, lambda m, h: m(h)[1][0].transpose(0, 1)),
    "GRU": sw(lambda: nn.GRU(8, 6, batch_first=True), S3),
    "GRU_bi_seqfirst": sw(lambda: nn.GRU(8, 6, 2, bidirectional=True), S3),
    "RNN_relu": sw(lambda: nn.RNN(8, 6, nonlinearity="relu", batch_first=True), S3),
    "RNN_tanh_hn": sw(lambda: nn.RNN(8, 6, 2, batch_first=True), S3, lambda m, h: m(h)[1].transpose(0, 1)),
    "LSTMCell": sw(lambda: nn.LSTMCell(8, 6), (8,)),
    "GRUCell": sw(lambda: nn.GRUCell(8, 6), (8,)),
    "RNNCell": sw(lambda: nn.RNNCell(8, 6), (8,)),
    "Bilinear": sw(lambda: nn.Bilinear(6, 6, 5), (2, 6), lambda m, h: m(h[:, 0], h[:, 1])),
    "Bilinear_diffdims": sw(lambda: nn.Bilinear(4, 8, 5, bias=False), (12,), lambda m, h: m(h[:, :4], h[:, 4:])),
}


# --- modules fed by an embedding ----------------------------------------------------------------------------
class BagModel(nn.Module):
    def __init__(self, mode, psw, offsets):
        super().__init__()
        self.lin0 = nn.Linear(D, 6)
        self.bag = nn.EmbeddingBag(40, 12, mode=mode)
        self.psw, self.offsets = psw, offsets
        self.lin2 = nn.Linear(12, 8)

    def forward(self, x, y):
        ids = (torch.arange(x.shape[0] * 6).view(x.shape[0], 6) * 7) % 40
        w = torch.sigmoid(self.lin0(x)) if self.psw else None
        if self.offsets:
            out = self.bag(ids.flatten(), torch.arange(0, x.shape[0] * 6, 6), per_sample_weights=None if w is None else w.flatten())
        else:
            out = self.bag(ids, per_sample_weights=w)
        return F.mse_loss(self.lin2(out), y)


class AdaptiveLSM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1 = nn.Linear(D, 12)
        self.asm = nn.AdaptiveLogSoftmaxWithLoss(12, 30, cutoffs=[8, 20], div_value=2.0)

    def forward(self, x, y):
        t = (y.abs() * 100).long().sum(-1) % 30
        out = self.asm(self.lin1(x), t)
        return out.loss + 0.1 * self.asm.log_prob(self.lin1(x)).exp().pow(2).mean()


LAYERS.update({
    "EmbeddingBag_sum": lambda: BagModel("sum", False, False),
    "EmbeddingBag_mean": lambda: BagModel("mean", False, False),
    "EmbeddingBag_max": lambda: BagModel("max", False, False),
    "EmbeddingBag_sum_psw": lambda: BagModel("sum", True, False),
    "EmbeddingBag_sum_offsets_psw": lambda: BagModel("sum", True, True),
    "AdaptiveLogSoftmaxWithLoss": AdaptiveLSM,
})


# --- losses --------------------------------------------------------------------------------------------------
C = 10


class LossModel(nn.Module):
    def __init__(self, loss, kind, red):
        super().__init__()
        self.lin1 = nn.Linear(D, 12)
        self.head = nn.Linear(12, C)
        self.head2 = nn.Linear(12, C)
        self.loss, self.kind, self.red = loss, kind, red

    def forward(self, x, y):
        h = torch.tanh(self.lin1(x))
        z = self.head(h)
        z2 = self.head2(h)
        n = x.shape[0]
        tgt = (y.abs() * 1000).long().sum(-1) % C
        k = self.kind
        if k == "class":            # CE / NLL / MultiMargin
            out = self.loss(z if not isinstance(self.loss, nn.NLLLoss) else F.log_softmax(z, -1), tgt)
        elif k == "class_ignore":
            tgt = torch.where(torch.arange(n) % 3 == 1, -100, tgt)
            out = self.loss(z if not isinstance(self.loss, nn.NLLLoss) else F.log_softmax(z, -1), tgt)
        elif k == "soft":          # probabilities as target
            out = self.loss(z, torch.softmax(z2.detach() * 3, -1))
        elif k == "reg":
            out = self.loss(z, z2.detach() * 0.5 + 0.1)
        elif k == "reg_both":
            out = self.loss(z, z2)
        elif k == "prob":          # BCE
            out = self.loss(torch.sigmoid(z), (z2.detach() > 0).float())
        elif k == "logits01":
            out = self.loss(z, (z2.detach() > 0).float())
        elif k == "kl":
            out = self.loss(F.log_softmax(z, -1), F.softmax(z2, -1))
        elif k == "kl_log":
            out = self.loss(F.log_softmax(z, -1), F.log_softmax(z2, -1))
        elif k == "pm1":          # targets +-1 (SoftMargin, HingeEmbedding)
            out = self.loss(z, torch.where(z2.detach() > 0, 1.0, -1.0))
        elif k == "hinge":
            out = self.loss((z - z2).abs(), torch.where(torch.arange(C) % 2 == 0, 1.0, -1.0).expand(n, C))
        elif k == "pair":         # CosineEmbedding / MarginRanking
            sign = torch.where(torch.arange(n) % 2 == 0, 1.0, -1.0)
            if isinstance(self.loss, nn.CosineEmbeddingLoss):
                out = self.loss(z, z2, sign)
            else:
                out = self.loss(z[:, 0], z2[:, 1], sign)
        elif k == "triplet":
            out = self.loss(z, z2, z.flip(0))
        elif k == "gauss":
            out = self.loss(z, z2.detach(), F.softplus(z2) + 0.1)
        elif k == "poisson_log":
            out = self.loss(z, (z2.detach().abs() * 3).floor())
        elif k == "poisson":
            out = self.loss(F.softplus(z), (z2.detach().abs() * 3).floor())
        elif k == "multilabel_margin":
            t = torch.full((n, C), -1, dtype=torch.long)
            t[:, 0] = tgt
            t[:, 1] = (tgt + 3) % C
            out = self.loss(z, t)
        elif k == "multilabel_soft":
            out = self.loss(z, (z2.detach() > 0).float())
        elif k == "lce":
            out = self.loss(h, self.head.weight, tgt)
        else:
            raise ValueError(k)
        if out.ndim:
            out = out.mean()
        return out


def _w():
    return torch.linspace(0.5, 2.0, C)


LOSSES = {
    "CrossEntropyLoss": (lambda r: nn.CrossEntropyLoss(reduction=r), "class"),
    "CrossEntropyLoss_w_ls": (lambda r: nn.CrossEntropyLoss(weight=_w(), label_smoothing=0.1, reduction=r), "class"),
    "CrossEntropyLoss_ignore_w": (lambda r: nn.CrossEntropyLoss(weight=_w(), reduction=r), "class_ignore"),
    "CrossEntropyLoss_soft_ls": (lambda r: nn.CrossEntropyLoss(label_smoothing=0.2, reduction=r), "soft"),
    "NLLLoss_w": (lambda r: nn.NLLLoss(weight=_w(), reduction=r), "class"),
    "NLLLoss_ignore": (lambda r: nn.NLLLoss(reduction=r), "class_ignore"),
    "MultiMarginLoss": (lambda r: nn.MultiMarginLoss(reduction=r), "class"),
    "MultiMarginLoss_p2_w": (lambda r: nn.MultiMarginLoss(p=2, margin=0.5, weight=_w(), reduction=r), "class"),
    "MSELoss": (lambda r: nn.MSELoss(reduction=r), "reg"),
    "L1Loss": (lambda r: nn.L1Loss(reduction=r), "reg_both"),
    "HuberLoss": (lambda r: nn.HuberLoss(reduction=r, delta=0.3), "reg"),
    "SmoothL1Loss": (lambda r: nn.SmoothL1Loss(reduction=r, beta=0.2), "reg_both"),
    "BCELoss_w": (lambda r: nn.BCELoss(weight=_w(), reduction=r), "prob"),
    "BCEWithLogitsLoss_pw": (lambda r: nn.BCEWithLogitsLoss(pos_weight=_w(), reduction=r), "logits01"),
    "KLDivLoss": (lambda r: nn.KLDivLoss(reduction=r if r != "mean" else "batchmean"), "kl"),
    "KLDivLoss_mean": (lambda r: nn.KLDivLoss(reduction=r), "kl"),
    "KLDivLoss_logtarget": (lambda r: nn.KLDivLoss(reduction=r, log_target=True), "kl_log"),
    "SoftMarginLoss": (lambda r: nn.SoftMarginLoss(reduction=r), "pm1"),
    "HingeEmbeddingLoss": (lambda r: nn.HingeEmbeddingLoss(margin=0.5, reduction=r), "hinge"),
    "CosineEmbeddingLoss": (lambda r: nn.CosineEmbeddingLoss(margin=0.1, reduction=r), "pair"),
    "MarginRankingLoss": (lambda r: nn.MarginRankingLoss(margin=0.2, reduction=r), "pair"),
    "TripletMarginLoss": (lambda r: nn.TripletMarginLoss(margin=1.0, p=2, swap=True, reduction=r), "triplet"),
    "TripletMarginWithDistanceLoss": (lambda r: nn.TripletMarginWithDistanceLoss(
        distance_function=lambda a, b: 1 - F.cosine_similarity(a, b), reduction=r), "triplet"),
    "GaussianNLLLoss": (lambda r: nn.GaussianNLLLoss(full=True, reduction=r), "gauss"),
    "PoissonNLLLoss_log": (lambda r: nn.PoissonNLLLoss(reduction=r), "poisson_log"),
    "PoissonNLLLoss_full": (lambda r: nn.PoissonNLLLoss(log_input=False, full=True, reduction=r), "poisson"),
    "MultiLabelMarginLoss": (lambda r: nn.MultiLabelMarginLoss(reduction=r), "multilabel_margin"),
    "MultiLabelSoftMarginLoss_w": (lambda r: nn.MultiLabelSoftMarginLoss(weight=_w(), reduction=r), "multilabel_soft"),
}
for _name, (_mk, _kind) in list(LOSSES.items()):
    for _r in ("mean", "sum", "none"):
        LAYERS[f"loss:{_name}:{_r}"] = (lambda mk=_mk, kind=_kind, r=_r: LossModel(mk(r), kind, r))


# --- linalg / special / fft / distributions ------------------------------------------------------------------
class OpModel(nn.Module):
    """lin1 -> (N, 4, 4) matrices (or (N, 16)) -> op -> lin2 -> mse."""
    def __init__(self, fn, out_numel):
        super().__init__()
        self.lin1 = nn.Linear(D, 16)
        self.fn = fn
        self.lin2 = nn.Linear(out_numel, 8)

    def forward(self, x, y):
        h = self.lin1(x)
        out = self.fn(h)
        return F.mse_loss(self.lin2(out.reshape(x.shape[0], -1)), y)


def _m(h):      # (N, 4, 4) well conditioned
    return h.view(h.shape[0], 4, 4) + 3 * torch.eye(4)


def _spd(h):
    a = h.view(h.shape[0], 4, 4)
    return a @ a.transpose(-1, -2) + torch.eye(4)


def _real(x):
    return torch.view_as_real(x) if x.is_complex() else x


OPS = {
    "linalg.norm_fro": lambda h: torch.linalg.norm(_m(h), dim=(-2, -1)).unsqueeze(-1),
    "linalg.norm_vec": lambda h: torch.linalg.norm(h, ord=3, dim=-1, keepdim=True),
    "linalg.vector_norm_inf": lambda h: torch.linalg.vector_norm(h.view(-1, 4, 4), ord=float("inf"), dim=-1),
    "linalg.vector_norm_all": lambda h: torch.linalg.vector_norm(h.view(-1, 4, 4), ord=1.5, dim=(1, 2)).unsqueeze(-1),
    "linalg.matrix_norm_nuc": lambda h: torch.linalg.matrix_norm(_m(h), ord="nuc").unsqueeze(-1),
    "linalg.matrix_norm_2": lambda h: torch.linalg.matrix_norm(_m(h), ord=2).unsqueeze(-1),
    "linalg.matrix_norm_1": lambda h: torch.linalg.matrix_norm(_m(h), ord=1).unsqueeze(-1),
    "linalg.det": lambda h: torch.linalg.det(_m(h)).unsqueeze(-1),
    "linalg.slogdet": lambda h: torch.linalg.slogdet(_m(h))[1].unsqueeze(-1),
    "linalg.inv": lambda h: torch.linalg.inv(_m(h)),
    "linalg.solve": lambda h: torch.linalg.solve(_m(h), h.view(-1, 4, 4)[..., 0]),
    "linalg.solve_left_false": lambda h: torch.linalg.solve(_m(h), h.view(-1, 4, 4), left=False),
    "linalg.qr": lambda h: torch.linalg.qr(_m(h))[1],
    "linalg.svdvals": lambda h: torch.linalg.svdvals(_m(h)),
    "linalg.svd_abs": lambda h: torch.linalg.svd(_m(h))[1],
    "linalg.eigh_vals": lambda h: torch.linalg.eigvalsh(_spd(h)),
    "linalg.eigh": lambda h: torch.linalg.eigh(_spd(h))[0],
    "linalg.cholesky": lambda h: torch.linalg.cholesky(_spd(h)),
    "linalg.pinv": lambda h: torch.linalg.pinv(_m(h)),
    "linalg.lstsq": lambda h: torch.linalg.lstsq(_m(h), h.view(-1, 4, 4)[..., :2]).solution,
    "linalg.cross": lambda h: torch.linalg.cross(h.view(-1, 4, 4)[..., :3], h.view(-1, 4, 4)[..., 1:]),
    "linalg.multi_dot": lambda h: torch.linalg.multi_dot([h.view(-1, 4, 4)[0], _m(h)[1], h.view(-1, 4, 4)[2]]).expand(h.shape[0], 4, 4),
    "linalg.matrix_exp": lambda h: torch.linalg.matrix_exp(0.3 * h.view(-1, 4, 4)),
    "linalg.vander": lambda h: torch.linalg.vander(h.view(-1, 4, 4)[..., 0], N=3),
    "linalg.matrix_power": lambda h: torch.linalg.matrix_power(0.5 * h.view(-1, 4, 4), 3),
    "linalg.cholesky_solve": lambda h: torch.cholesky_solve(h.view(-1, 4, 4), torch.linalg.cholesky(_spd(h))),
    "linalg.tensorsolve": lambda h: torch.linalg.solve_triangular(torch.linalg.cholesky(_spd(h)), h.view(-1, 4, 4), upper=False),
    "special.logsumexp": lambda h: torch.special.logsumexp(h.view(-1, 4, 4), dim=-1),
    "special.logsumexp_dim1": lambda h: torch.logsumexp(h.view(-1, 4, 4), dim=1),
    "special.logit": lambda h: torch.special.logit(torch.sigmoid(h), eps=1e-3),
    "special.xlogy": lambda h: torch.special.xlogy(h, h.abs() + 0.5),
    "special.entr": lambda h: torch.special.entr(torch.sigmoid(h)),
    "special.erfinv": lambda h: torch.special.erfinv(torch.tanh(h) * 0.9),
    "special.i0": lambda h: torch.special.i0(h),
    "special.i1e": lambda h: torch.special.i1e(h),
    "special.log_ndtr": lambda h: torch.special.log_ndtr(h),
    "special.ndtri": lambda h: torch.special.ndtri(torch.sigmoid(h)),
    "special.softmax": lambda h: torch.special.softmax(h.view(-1, 4, 4), 1),
    "special.log_softmax": lambda h: torch.special.log_softmax(h, -1),
    "special.digamma": lambda h: torch.special.digamma(h.abs() + 1),
    "special.gammaln": lambda h: torch.special.gammaln(h.abs() + 0.5),
    "special.sinc": lambda h: torch.special.sinc(h),
    "special.erfcx": lambda h: torch.special.erfcx(h),
    "fft.rfft_last": lambda h: _real(torch.fft.rfft(h, dim=-1)),
    "fft.rfft_norm_ortho": lambda h: _real(torch.fft.rfft(h.view(-1, 4, 4), dim=1, norm="ortho")),
    "fft.irfft": lambda h: torch.fft.irfft(torch.fft.rfft(h, dim=-1) * 1.5, n=16, dim=-1),
    "fft.fft2": lambda h: _real(torch.fft.fft2(h.view(-1, 4, 4))),
    "fft.ifft_complex": lambda h: torch.fft.ifft(torch.complex(h, h.flip(-1))).abs(),
    "fft.fftn_forward": lambda h: _real(torch.fft.fftn(h.view(-1, 4, 4), dim=(0, 2), norm="forward")),
    "fft.hfft": lambda h: torch.fft.hfft(torch.complex(h[:, :8], h[:, 8:]), n=10),
    "fft.fftshift": lambda h: torch.fft.fftshift(h.view(-1, 4, 4), dim=(-1,)),
    "cdist": lambda h: torch.cdist(h.view(-1, 4, 4), h.view(-1, 4, 4).flip(1)),
    "cdist_p1_batch": lambda h: torch.cdist(h.view(-1, 16), h.view(-1, 16), p=1.0),
    "bucketize": lambda h: h * torch.bucketize(h.detach(), torch.linspace(-1, 1, 5)).float(),
    "searchsorted": lambda h: h * torch.searchsorted(torch.sort(h.detach(), -1)[0], h.detach().flip(-1)).float(),
    "grid_sample": lambda h: F.grid_sample(h.view(-1, 1, 4, 4), torch.tanh(h.view(-1, 4, 2, 2).permute(0, 2, 3, 1)[..., :2]),
                                           align_corners=False),
    "grid_sample_nearest_border": lambda h: F.grid_sample(h.view(-1, 1, 4, 4), torch.tanh(h.view(-1, 2, 2, 4)[..., :2] * 2),
                                                          mode="bilinear", padding_mode="border", align_corners=True),
    "affine_grid": lambda h: F.affine_grid(h.view(-1, 16)[:, :6].reshape(-1, 2, 3), [h.shape[0], 1, 3, 3], align_corners=False),
    "affine_grid_sample": lambda h: F.grid_sample(h.view(-1, 1, 4, 4), F.affine_grid(h[:, :6].reshape(-1, 2, 3) * 0.5,
                                                                                        [h.shape[0], 1, 4, 4], align_corners=False)),
    "normalize_last": lambda h: F.normalize(h, dim=-1),
    "normalize_dim0": lambda h: F.normalize(h, p=1, dim=0),
    "embedding_bag_fn": lambda h: F.embedding_bag(torch.arange(h.shape[0] * 3).view(h.shape[0], 3) % 4, h.view(-1, 4, 4)[0], mode="max"),
    "dist_normal": lambda h: torch.distributions.Normal(h[:, :8], F.softplus(h[:, 8:]) + 0.1).log_prob(h[:, :8].detach() * 0.5),
    "dist_normal_kl": lambda h: torch.distributions.kl_divergence(
        torch.distributions.Normal(h[:, :8], F.softplus(h[:, 8:]) + 0.1), torch.distributions.Normal(0.0, 1.0)).sum(-1, keepdim=True),
    "dist_normal_entropy_rsample0": lambda h: torch.distributions.Normal(h[:, :8], F.softplus(h[:, 8:]) + 0.1).entropy(),
    "dist_categorical": lambda h: torch.distributions.Categorical(logits=h).log_prob(torch.arange(h.shape[0]) % 16).unsqueeze(-1)
                                  * h.detach().mean(-1, keepdim=True),
    "dist_categorical_entropy": lambda h: torch.distributions.Categorical(logits=h).entropy().unsqueeze(-1),
    "dist_categorical_probs": lambda h: torch.distributions.Categorical(probs=torch.softmax(h, -1)).entropy().unsqueeze(-1),
    "dist_bernoulli": lambda h: torch.distributions.Bernoulli(logits=h).log_prob((h.detach() > 0).float()),
    "dist_mvn": lambda h: torch.distributions.MultivariateNormal(h[:, :4], scale_tril=torch.linalg.cholesky(_spd(h))).log_prob(
        torch.zeros(4)).unsqueeze(-1),
}


def _op_out(fn):
    with torch.no_grad():
        return fn(torch.randn(N, 16))[0].numel()


for _name, _fn in OPS.items():
    LAYERS[f"op:{_name}"] = (lambda fn=_fn: OpModel(fn, _op_out(fn)))


def build(name):
    torch.manual_seed(0)
    model = LAYERS[name]()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, D, generator=g)
    y = torch.randn(N, 8, generator=g)
    return model, (x, y)


# distributions without the argument checks (what the TraceError's remedy says), and GaussianNLL written out
_D = torch.distributions
OPS2 = {
    "distnv_normal_logprob": lambda h: _D.Normal(h[:, :8], F.softplus(h[:, 8:]) + 0.1, validate_args=False).log_prob(h[:, :8].detach() * 0.5),
    "distnv_normal_kl": lambda h: _D.kl_divergence(_D.Normal(h[:, :8], F.softplus(h[:, 8:]) + 0.1, validate_args=False),
                                                   _D.Normal(torch.zeros(8), torch.ones(8), validate_args=False)).sum(-1, keepdim=True),
    "distnv_normal_rsample_entropy": lambda h: _D.Normal(h[:, :8], F.softplus(h[:, 8:]) + 0.1, validate_args=False).entropy(),
    "distnv_categorical_pg": lambda h: _D.Categorical(logits=h, validate_args=False).log_prob(torch.arange(h.shape[0]) % 16).unsqueeze(-1)
                                       * h.detach().mean(-1, keepdim=True),
    "distnv_categorical_entropy": lambda h: _D.Categorical(logits=h, validate_args=False).entropy().unsqueeze(-1),
    "distnv_categorical_probs_lp": lambda h: _D.Categorical(probs=torch.softmax(h, -1), validate_args=False).log_prob(
        torch.arange(h.shape[0]) % 16).unsqueeze(-1),
    "distnv_bernoulli": lambda h: _D.Bernoulli(logits=h, validate_args=False).log_prob((h.detach() > 0).float()),
    "distnv_mvn": lambda h: _D.MultivariateNormal(h[:, :4], scale_tril=torch.linalg.cholesky(_spd(h)), validate_args=False).log_prob(
        torch.zeros(4)).unsqueeze(-1),
    "distnv_independent_normal": lambda h: _D.Independent(_D.Normal(h.view(-1, 4, 4), 1.0, validate_args=False), 2,
                                                          validate_args=False).log_prob(torch.zeros(4, 4)).unsqueeze(-1),
    "distnv_mixture": lambda h: _D.MixtureSameFamily(_D.Categorical(logits=h[:, :4], validate_args=False),
                                                     _D.Normal(h[:, 4:8], F.softplus(h[:, 8:12]) + 0.1, validate_args=False),
                                                     validate_args=False).log_prob(h[:, 12].detach()).unsqueeze(-1),
}
for _name, _fn in OPS2.items():
    LAYERS[f"op:{_name}"] = (lambda fn=_fn: OpModel(fn, _op_out(fn)))


class AdaptiveLSMLogProb(AdaptiveLSM):
    def forward(self, x, y):
        t = (y.abs() * 100).long().sum(-1) % 30
        return -self.asm.log_prob(self.lin1(x)).gather(1, t[:, None]).mean()


LAYERS["AdaptiveLogSoftmax_log_prob_gather"] = AdaptiveLSMLogProb
