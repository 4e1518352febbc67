"""Tiny transformers families for round 10f (module-level builders, importable by spawned ranks).

Each builder returns (model, args, kwargs); every dropout probability 0 (zoo.families._build), sizes tiny."""
from __future__ import annotations

import torch
import transformers as T

from parallelizer.zoo.families import _build

B, S, V = 4, 16, 128
TXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=V)


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _ids(seed=1, seq=S, low=0, hi=V):
    return torch.randint(low, hi, (B, seq), generator=_g(seed))


def _mlm(cfg, cls, seed=0, device="cpu", low=0, **extra):
    ids = _ids(low=low)
    m = _build(getattr(T, cfg), getattr(T, cls), {**TXT, **extra}, seed, device)
    return m, (ids,), {"labels": ids}


def splinter(seed=0, device="cpu"):
    ids = _ids(low=5)
    m = _build(T.SplinterConfig, T.SplinterForQuestionAnswering, dict(TXT), seed, device)
    s = torch.tensor([1, 2, 3, 4]); e = torch.tensor([2, 3, 5, 6])
    return m, (ids,), {"start_positions": s, "end_positions": e}


def markuplm(seed=0, device="cpu"):
    ids = _ids(low=5)
    m = _build(T.MarkupLMConfig, T.MarkupLMForQuestionAnswering, dict(TXT, max_depth=8), seed, device)
    xt = torch.randint(0, 50, (B, S, 8), generator=_g(2)); xs = torch.randint(0, 50, (B, S, 8), generator=_g(3))
    return m, (ids,), {"xpath_tags_seq": xt, "xpath_subs_seq": xs, "start_positions": torch.tensor([1, 2, 3, 4]),
                       "end_positions": torch.tensor([2, 3, 5, 6])}


def lilt(seed=0, device="cpu"):
    ids = _ids(low=5)
    m = _build(T.LiltConfig, T.LiltForSequenceClassification, dict(TXT, hidden_size=48, channel_shrink_ratio=4), seed, device)
    x0 = torch.randint(0, 400, (B, S, 2), generator=_g(2)); y0 = torch.randint(0, 400, (B, S, 2), generator=_g(3))
    bbox = torch.stack([x0[..., 0], y0[..., 0], x0[..., 0] + x0[..., 1], y0[..., 0] + y0[..., 1]], -1)
    return m, (ids,), {"bbox": bbox, "labels": torch.tensor([0, 1, 1, 0])}


def tapas(seed=0, device="cpu"):
    ids = _ids()
    m = _build(T.TapasConfig, T.TapasForMaskedLM, dict(TXT), seed, device)
    tt = torch.randint(0, 2, (B, S, 7), generator=_g(2))
    return m, (ids,), {"token_type_ids": tt, "labels": ids}


def ibert(seed=0, device="cpu"):
    return _mlm("IBertConfig", "IBertForMaskedLM", seed, device, low=2)


def megatron_bert(seed=0, device="cpu"):
    return _mlm("MegatronBertConfig", "MegatronBertForMaskedLM", seed, device)


def data2vec_text(seed=0, device="cpu"):
    return _mlm("Data2VecTextConfig", "Data2VecTextForMaskedLM", seed, device, low=2)


def yolos(seed=0, device="cpu"):
    m = _build(T.YolosConfig, T.YolosModel, dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                 num_attention_heads=4, image_size=[32, 32], patch_size=8,
                                                 num_detection_tokens=4), seed, device)
    return m, (torch.randn(B, 3, 32, 32, generator=_g(1)),), {}


def vitmae(seed=0, device="cpu", mask_ratio=0.0):
    m = _build(T.ViTMAEConfig, T.ViTMAEForPreTraining, dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, image_size=32, patch_size=8, decoder_hidden_size=32, decoder_num_hidden_layers=1,
               decoder_num_attention_heads=4, decoder_intermediate_size=64, mask_ratio=mask_ratio), seed, device)
    return m, (torch.randn(B, 3, 32, 32, generator=_g(1)),), {}


def data2vec_audio(seed=0, device="cpu"):
    m = _build(T.Data2VecAudioConfig, T.Data2VecAudioModel, dict(hidden_size=32, intermediate_size=64,
               num_hidden_layers=2, num_attention_heads=4, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
               num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2, mask_time_prob=0.0), seed, device)
    return m, (torch.randn(B, 400, generator=_g(1)),), {}


def fuyu(seed=0, device="cpu"):
    ids = _ids()
    m = _build(T.FuyuConfig, T.FuyuForCausalLM, dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, vocab_size=V, patch_size=4, num_channels=3), seed, device)
    return m, (ids,), {"labels": ids}


def emu3(seed=0, device="cpu"):
    ids = _ids()
    m = _build(T.Emu3TextConfig, T.Emu3ForCausalLM, dict(TXT, num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2), seed, device)
    return m, (ids,), {"labels": ids}


def git(seed=0, device="cpu"):
    ids = _ids()
    vis = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, image_size=16,
               patch_size=8)
    m = _build(T.GitConfig, T.GitForCausalLM, dict(TXT, vision_config=vis, max_position_embeddings=64), seed, device)
    return m, (ids,), {"pixel_values": torch.randn(B, 3, 16, 16, generator=_g(2)), "labels": ids}


def blip_text(seed=0, device="cpu"):
    ids = _ids()
    m = _build(T.BlipTextConfig, T.BlipTextLMHeadModel, dict(TXT, encoder_hidden_size=32), seed, device)
    enc = torch.randn(B, 5, 32, generator=_g(2))
    return m, (ids,), {"encoder_hidden_states": enc, "labels": ids}


def pixtral_vision(seed=0, device="cpu"):
    m = _build(T.PixtralVisionConfig, T.PixtralVisionModel, dict(hidden_size=32, intermediate_size=64,
               num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8, head_dim=8), seed, device)
    return m, (torch.randn(B, 3, 32, 32, generator=_g(1)),), {"image_sizes": torch.tensor([[32, 32]] * B)}


def depth_anything(seed=0, device="cpu"):
    bb = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=28,
              patch_size=14, out_indices=[1, 2], reshape_hidden_states=False)
    cfg = T.DepthAnythingConfig(backbone_config=T.Dinov2Config(**bb), reassemble_hidden_size=32,
                                neck_hidden_sizes=[16, 32], fusion_hidden_size=16, head_hidden_size=8,
                                reassemble_factors=[2, 1])
    torch.manual_seed(seed)
    m = T.DepthAnythingForDepthEstimation(cfg).train()
    return m, (torch.randn(B, 3, 28, 28, generator=_g(1)),), {}


def swin2sr(seed=0, device="cpu"):
    m = _build(T.Swin2SRConfig, T.Swin2SRForImageSuperResolution, dict(image_size=16, embed_dim=16, depths=[2],
               num_heads=[2], window_size=4, upscale=2), seed, device)
    return m, (torch.randn(B, 3, 16, 16, generator=_g(1)),), {}


def convnext_backbone(seed=0, device="cpu"):
    m = _build(T.ConvNextConfig, T.ConvNextBackbone, dict(num_stages=2, hidden_sizes=[8, 16], depths=[1, 1],
               out_features=["stage1", "stage2"]), seed, device)
    return m, (torch.randn(B, 3, 32, 32, generator=_g(1)),), {}


def _ts(cfg_cls, model_cls, seed, extra):
    ctx, pred = 12, 4
    cfg = dict(prediction_length=pred, context_length=ctx, lags_sequence=[1, 2], d_model=16, encoder_layers=2,
               decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
               decoder_ffn_dim=32, num_time_features=1, **extra)
    m = _build(cfg_cls, model_cls, cfg, seed, "cpu")
    past = ctx + 2
    g = _g(1)
    kw = dict(past_values=torch.randn(B, past, generator=g), past_time_features=torch.randn(B, past, 1, generator=g),
              past_observed_mask=torch.ones(B, past), future_values=torch.randn(B, pred, generator=g),
              future_time_features=torch.randn(B, pred, 1, generator=g))
    return m, (), kw


def time_series_transformer(seed=0, device="cpu"):
    torch.distributions.Distribution.set_default_validate_args(False)  # the tracer's remedy
    return _ts(T.TimeSeriesTransformerConfig, T.TimeSeriesTransformerForPrediction, seed, {})


def informer(seed=0, device="cpu"):
    return _ts(T.InformerConfig, T.InformerForPrediction, seed, {})


def autoformer(seed=0, device="cpu"):
    return _ts(T.AutoformerConfig, T.AutoformerForPrediction, seed, {})


def patchtsmixer(seed=0, device="cpu"):
    m = _build(T.PatchTSMixerConfig, T.PatchTSMixerForPrediction, dict(context_length=16, patch_length=4,
               patch_stride=4, num_input_channels=3, d_model=16, num_layers=2, prediction_length=4), seed, device)
    g = _g(1)
    return m, (torch.randn(B, 16, 3, generator=g),), {"future_values": torch.randn(B, 4, 3, generator=g)}


def seamless_t2t(seed=0, device="cpu"):
    ids = _ids(low=4)
    cfg = dict(hidden_size=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=V, t2u_vocab_size=V,
               speech_encoder_layers=1, t2u_encoder_layers=1, t2u_decoder_layers=1, max_position_embeddings=64)
    m = _build(T.SeamlessM4TConfig, T.SeamlessM4TForTextToText, cfg, seed, device)
    return m, (ids,), {"labels": _ids(seed=3, seq=8, low=4)}


def speecht5_s2t(seed=0, device="cpu"):
    cfg = dict(hidden_size=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=V,
               conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=4,
               num_conv_pos_embedding_groups=2, mask_time_prob=0.0, speech_decoder_prenet_units=16)
    m = _build(T.SpeechT5Config, T.SpeechT5ForSpeechToText, cfg, seed, device)
    return m, (torch.randn(B, 400, generator=_g(1)),), {"labels": _ids(seed=3, seq=8, low=4)}


def speecht5_tts(seed=0, device="cpu"):
    cfg = dict(hidden_size=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=V,
               num_mel_bins=8, speech_decoder_prenet_units=16, speech_decoder_postnet_units=16,
               speech_decoder_postnet_layers=2, speech_decoder_postnet_kernel=3, reduction_factor=2,
               speaker_embedding_dim=16, mask_time_prob=0.0)
    m = _build(T.SpeechT5Config, T.SpeechT5ForTextToSpeech, cfg, seed, device)
    g = _g(2)
    return m, (_ids(low=4),), {"attention_mask": torch.ones(B, S, dtype=torch.long), "labels": torch.randn(B, 8, 8, generator=g),
                                "speaker_embeddings": torch.randn(B, 16, generator=g)}


ALL = ["splinter", "markuplm", "lilt", "tapas", "ibert", "megatron_bert", "data2vec_text", "yolos", "vitmae",
       "data2vec_audio", "fuyu", "emu3", "git", "blip_text", "pixtral_vision", "depth_anything", "swin2sr",
       "convnext_backbone", "time_series_transformer", "informer", "autoformer", "patchtsmixer", "seamless_t2t",
       "speecht5_s2t", "speecht5_tts"]


def speecht5_tts_nolabel(seed=0, device="cpu"):
    """SpeechT5ForTextToSpeech without labels (its loss masked_selects by label padding): spectrogram output."""
    m, a, k = speecht5_tts(seed, device)
    g = _g(4)
    return m, a, {"decoder_input_values": torch.randn(B, 8, 8, generator=g), "speaker_embeddings": k["speaker_embeddings"]}


def vitmae_masked(seed=0, device="cpu"):
    """ViTMAE with its default mask_ratio 0.75 (torch.rand noise: random per call)."""
    return vitmae(seed, device, mask_ratio=0.75)


def vitmae_noise(seed=0, device="cpu"):
    """ViTMAE, default mask_ratio 0.75, with its `noise` passed in (no random draw in forward)."""
    m, a, _ = vitmae(seed, device, mask_ratio=0.75)
    return m, a, {"noise": torch.rand(B, 16, generator=_g(5))}
