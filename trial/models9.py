"""Round 9 (trial r9a) builders: transformers families nobody here tried, DEFAULT options, sizes small, dropout 0.

Module-level builders returning (model, args, kwargs), importable by spawned ranks."""
from __future__ import annotations

import torch
import transformers as T

from parallelizer.zoo.families import _build

B, S, V = 4, 16, 128


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _img(c=3, h=32, w=32, seed=1, b=B):
    return torch.randn(b, c, h, w, generator=_g(seed))


def _nodrop(d: dict) -> dict:
    """Zero every dropout-like float of a sub-config dict."""
    return {k: (0.0 if isinstance(v, float) and any(w in k for w in ("dropout", "pdrop", "layerdrop", "drop_path"))
                else v) for k, v in d.items()}


# ---------------------------------------------------------------- dense vision: upsampling / deconvolution
def segformer(seed=0, device="cpu"):
    """SegformerForSemanticSegmentation: overlapping patch convs, efficient attention with a strided reduction
    conv (sr_ratios), Mix-FFN depthwise conv, all-MLP decoder with bilinear interpolate to 1/4 resolution."""
    m = _build(T.SegformerConfig, T.SegformerForSemanticSegmentation,
               dict(depths=[1, 1, 1, 1], hidden_sizes=[8, 16, 24, 32], num_attention_heads=[1, 2, 2, 4],
                    decoder_hidden_size=32, num_labels=3, classifier_dropout_prob=0.0, drop_path_rate=0.0),
               seed, device)
    labels = torch.randint(0, 3, (B, 32, 32), generator=_g(2))
    return m, (_img(),), {"labels": labels}


def dpt(seed=0, device="cpu"):
    """DPTForDepthEstimation: ViT backbone, reassemble with ConvTranspose2d (factors 4 and 2) and a strided conv,
    fusion with bilinear interpolate (align_corners=True), depth head with interpolate x2."""
    m = _build(T.DPTConfig, T.DPTForDepthEstimation,
               dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64, image_size=32,
                    patch_size=8, neck_hidden_sizes=[8, 16, 24, 32], fusion_hidden_size=16, backbone_out_indices=[0, 1, 2, 3],
                    head_in_index=-1), seed, device)
    return m, (_img(),), {}


def dpt_seg(seed=0, device="cpu"):
    """DPTForSemanticSegmentation (with the auxiliary head), labels (B, 32, 32)."""
    m = _build(T.DPTConfig, T.DPTForSemanticSegmentation,
               dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64, image_size=32,
                    patch_size=8, neck_hidden_sizes=[8, 16, 24, 32], fusion_hidden_size=16, backbone_out_indices=[0, 1, 2, 3],
                    num_labels=3, semantic_classifier_dropout=0.0), seed, device)
    return m, (_img(),), {"labels": torch.randint(0, 3, (B, 32, 32), generator=_g(2))}


def upernet(seed=0, device="cpu"):
    """UperNetForSemanticSegmentation with its default ConvNext backbone: PSP pooling module (adaptive avg pools
    1, 2, 3, 6), FPN with interpolate, auxiliary FCN head; labels (B, 64, 64)."""
    bb = T.ConvNextConfig(hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], out_features=["stage1", "stage2", "stage3", "stage4"])
    m = _build(T.UperNetConfig, T.UperNetForSemanticSegmentation,
               dict(backbone_config=bb, hidden_size=16, auxiliary_channels=8, num_labels=3), seed, device)
    return m, (_img(h=64, w=64),), {"labels": torch.randint(0, 3, (B, 64, 64), generator=_g(2))}


def swin2sr(seed=0, device="cpu"):
    """Swin2SRForImageSuperResolution: pixel-shuffle upsampler (x2), log-spaced continuous relative position bias
    (cpb MLP), window attention with cyclic shift, padding to the window size."""
    m = _build(T.Swin2SRConfig, T.Swin2SRForImageSuperResolution,
               dict(image_size=16, embed_dim=16, depths=[2], num_heads=[2], window_size=4, upscale=2,
                    num_layers=1), seed, device)
    return m, (_img(h=16, w=16),), {}


def swin2sr_nearest(seed=0, device="cpu"):
    """Swin2SR with the nearest+conv upsampler (upscale 4: two interpolate(scale 2, nearest) + conv)."""
    m = _build(T.Swin2SRConfig, T.Swin2SRForImageSuperResolution,
               dict(image_size=16, embed_dim=16, depths=[2], num_heads=[2], window_size=4, upscale=4,
                    num_layers=1, upsampler="nearest+conv"), seed, device)
    return m, (_img(h=16, w=16),), {}


def maskformer(seed=0, device="cpu"):
    """MaskFormerForInstanceSegmentation (default Swin backbone, DETR decoder), no labels (the loss needs
    scipy's Hungarian matcher): outputs class and mask logits."""
    bb = T.SwinConfig(image_size=64, embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2], window_size=4,
                      out_features=["stage1", "stage2", "stage3", "stage4"])
    dec = T.DetrConfig(d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4,
                       decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, dropout=0.0,
                       attention_dropout=0.0, activation_dropout=0.0, num_queries=8)
    m = _build(T.MaskFormerConfig, T.MaskFormerForInstanceSegmentation,
               dict(backbone_config=bb, decoder_config=dec, fpn_feature_size=32, mask_feature_size=32, num_queries=8,
                    num_labels=3), seed, device)
    return m, (_img(h=64, w=64),), {}


def mask2former(seed=0, device="cpu"):
    """Mask2FormerForUniversalSegmentation (default Swin backbone, multi-scale deformable attention pixel decoder
    with grid_sample, masked attention decoder), no labels."""
    bb = T.SwinConfig(image_size=64, embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2], window_size=4,
                      out_features=["stage1", "stage2", "stage3", "stage4"])
    m = _build(T.Mask2FormerConfig, T.Mask2FormerForUniversalSegmentation,
               dict(backbone_config=bb, feature_size=32, mask_feature_size=32, hidden_dim=32, encoder_feedforward_dim=32,
                    encoder_layers=1, decoder_layers=2, num_attention_heads=2, dim_feedforward=32, num_queries=8,
                    num_labels=3, common_stride=4), seed, device)
    return m, (_img(h=64, w=64),), {}


def sam(seed=0, device="cpu"):
    """SamModel: ViT image encoder with decomposed relative position tables (interpolated), neck convs, prompt
    encoder (random Fourier positional embedding), two-way transformer (cross-attention tokens <-> image, different
    lengths), ConvTranspose2d upscaling, hypernetwork MLPs; points as prompts."""
    vc = T.SamVisionConfig(hidden_size=32, output_channels=16, num_hidden_layers=2, num_attention_heads=2,
                           image_size=64, patch_size=8, mlp_dim=64, global_attn_indexes=[1], window_size=4,
                           num_pos_feats=8)
    pc = T.SamPromptEncoderConfig(hidden_size=16, image_size=64, patch_size=8, mask_input_channels=4)
    mc = T.SamMaskDecoderConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, mlp_dim=32,
                                iou_head_hidden_dim=16)
    torch.manual_seed(seed)
    with torch.device(device):
        m = T.SamModel(T.SamConfig(vision_config=vc.to_dict(), prompt_encoder_config=pc.to_dict(),
                                   mask_decoder_config=mc.to_dict())).train()
    pts = torch.rand(B, 1, 2, 2, generator=_g(3)) * 64
    lab = torch.ones(B, 1, 2, dtype=torch.long)
    return m, (_img(h=64, w=64),), {"input_points": pts, "input_labels": lab}


def zoedepth(seed=0, device="cpu"):
    """ZoeDepthForDepthEstimation (default BEiT backbone with relative position bias, DPT neck, metric bins with
    attractors, log-binomial head)."""
    bb = T.BeitConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64, image_size=32,
                      patch_size=8, out_indices=[1, 2, 3, 4], use_relative_position_bias=True, reshape_hidden_states=False,
                      out_features=["stage1", "stage2", "stage3", "stage4"])
    m = _build(T.ZoeDepthConfig, T.ZoeDepthForDepthEstimation,
               dict(backbone_config=bb, neck_hidden_sizes=[8, 16, 24, 32], fusion_hidden_size=16, bottleneck_features=16,
                    num_relative_features=8, bin_embedding_dim=16, num_attractors=[4, 2, 2, 1],
                    patch_transformer_hidden_size=16, patch_transformer_intermediate_size=32,
                    patch_transformer_num_attention_heads=2, num_patch_transformer_layers=1, bin_configurations=[
                        {"n_bins": 8, "min_depth": 0.001, "max_depth": 10.0, "name": "nyu"}],
                    backbone_hidden_size=32), seed, device)
    return m, (_img(),), {}


def depth_pro(seed=0, device="cpu"):
    """DepthProForDepthEstimation: multi-scale patches (interpolate to 0.25/0.5/1 and unfold with overlaps),
    two Dinov2 encoders, ConvTranspose2d upsampling, fusion, FOV head."""
    enc = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32,
               patch_size=8)
    m = _build(T.DepthProConfig, T.DepthProForDepthEstimation,
               dict(fusion_hidden_size=16, patch_size=32, intermediate_hook_ids=[1, 0], intermediate_feature_dims=[16, 16],
                    scaled_images_ratios=[0.5, 1.0], scaled_images_overlap_ratios=[0.0, 0.5],
                    scaled_images_feature_dims=[16, 16], image_model_config=dict(enc, model_type="dinov2"),
                    patch_model_config=dict(enc, model_type="dinov2"), fov_model_config=dict(enc, model_type="dinov2"),
                    use_fov_model=True, num_fov_head_layers=1), seed, device)
    return m, (_img(h=64, w=64),), {}


VISION = ["segformer", "dpt", "dpt_seg", "upernet", "swin2sr", "swin2sr_nearest", "maskformer", "mask2former", "sam",
          "zoedepth", "depth_pro"]


# ---------------------------------------------------------------- vision-language models
IMG_TOK = 10
TXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           vocab_size=V, head_dim=8)


def _vl_ids(k: int, seed: int = 5, tok: int = IMG_TOK, seq: int = S):
    """(B, seq) ids >= 11 with `k` image tokens at positions 1..k of every row."""
    ids = torch.randint(11, V, (B, seq), generator=_g(seed))
    ids[:, 1:1 + k] = tok
    return ids


def _vl(config_cls, model_cls, cfg: dict, seed, device):
    torch.manual_seed(seed)
    with torch.device(device):
        return model_cls(config_cls(**cfg)).train()


def mistral3(seed=0, device="cpu"):
    """Mistral3ForConditionalGeneration: Pixtral vision (2-D rotary, block-diagonal mask over images), patch merger
    (unfold of spatial_merge_size 2), Mistral text; 32x32 images, patch 8 -> 16 patches -> 4 image tokens."""
    vc = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, head_dim=8,
              image_size=32, patch_size=8, model_type="pixtral")
    m = _vl(T.Mistral3Config, T.Mistral3ForConditionalGeneration,
            dict(vision_config=vc, text_config=dict(TXT, model_type="mistral"), image_token_index=IMG_TOK), seed, device)
    ids = _vl_ids(4)
    sizes = torch.tensor([[32, 32]] * B)
    return m, (ids,), {"pixel_values": _img(), "image_sizes": sizes, "labels": ids}


def _idefics(config_cls, model_cls, vt, seed, device):
    vc = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
              patch_size=8, model_type=vt)
    m = _vl(config_cls, model_cls, dict(vision_config=vc, text_config=dict(TXT, model_type="llama"),
                                         image_token_id=IMG_TOK, scale_factor=2), seed, device)
    ids = _vl_ids(4)
    return m, (ids,), {"pixel_values": _img().unsqueeze(1), "labels": ids}


def idefics3(seed=0, device="cpu"):
    """Idefics3ForConditionalGeneration: SigLIP-like vision with a patch attention mask, pixel-shuffle connector
    (scale 2: 16 patches -> 4 tokens of 4x width), Llama text."""
    return _idefics(T.Idefics3Config, T.Idefics3ForConditionalGeneration, "idefics3_vision", seed, device)


def smolvlm(seed=0, device="cpu"):
    """SmolVLMForConditionalGeneration (Idefics3's architecture, its own classes)."""
    return _idefics(T.SmolVLMConfig, T.SmolVLMForConditionalGeneration, "smolvlm_vision", seed, device)


def internvl(seed=0, device="cpu"):
    """InternVLForConditionalGeneration: InternViT (layer scale, mean pooling off), pixel shuffle with
    downsample_ratio 0.5, MLP projector, Qwen2 text."""
    vc = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=[32, 32],
              patch_size=[8, 8], model_type="internvl_vision")
    m = _vl(T.InternVLConfig, T.InternVLForConditionalGeneration,
            dict(vision_config=vc, text_config=dict(TXT, model_type="qwen2"), image_token_id=IMG_TOK), seed, device)
    ids = _vl_ids(4)
    return m, (ids,), {"pixel_values": _img(), "labels": ids}


def aria(seed=0, device="cpu"):
    """AriaForConditionalGeneration: Idefics3 vision, cross-attention projector (learned queries attend to the
    patches: another sequence length), MoE text (8 experts top-2 + shared experts, grouped GEMM)."""
    vc = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
              patch_size=8, model_type="idefics3_vision")
    tc = dict(TXT, model_type="aria_text", moe_num_experts=4, moe_topk=2, moe_num_shared_experts=1)
    m = _vl(T.AriaConfig, T.AriaForConditionalGeneration,
            dict(vision_config=vc, text_config=tc, image_token_index=IMG_TOK, projector_patch_to_query_dict={16: 4},
                 max_value_projector_patch_to_query_dict=4), seed, device)
    ids = _vl_ids(4)
    return m, (ids,), {"pixel_values": _img(), "labels": ids}


def got_ocr2(seed=0, device="cpu"):
    """GotOcr2ForConditionalGeneration: SAM-style ViT (windowed attention with padding, decomposed relative
    position tables), two strided convs, Qwen2 text; 64x64 image, patch 8 -> 8x8 -> 2x2 = 4 tokens."""
    vc = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=64, patch_size=8, mlp_dim=64,
              window_size=3, global_attn_indexes=[1], output_channels=16, model_type="got_ocr2_vision")
    m = _vl(T.GotOcr2Config, T.GotOcr2ForConditionalGeneration,
            dict(vision_config=vc, text_config=dict(TXT, model_type="qwen2"), image_token_index=IMG_TOK), seed, device)
    ids = _vl_ids(4)
    return m, (ids,), {"pixel_values": _img(h=64, w=64), "labels": ids}


def kosmos2(seed=0, device="cpu"):
    """Kosmos2ForConditionalGeneration: CLIP-like vision, perceiver-style resampler (latent queries cross-attend
    to patches), text decoder with sinusoidal positions; image_embeds_position_mask marks 4 latent slots."""
    vc = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
              patch_size=8)
    tc = dict(vocab_size=V, embed_dim=32, layers=2, ffn_dim=64, attention_heads=4, dropout=0.0, attention_dropout=0.0,
              activation_dropout=0.0, max_position_embeddings=64)
    m = _vl(T.Kosmos2Config, T.Kosmos2ForConditionalGeneration,
            dict(vision_config=vc, text_config=tc, latent_query_num=4), seed, device)
    ids = torch.randint(11, V, (B, S), generator=_g(5))
    mask = torch.zeros(B, S, dtype=torch.long)
    mask[:, 1:5] = 1
    return m, (_img(),), {"input_ids": ids, "image_embeds_position_mask": mask, "labels": ids}


def florence2(seed=0, device="cpu"):
    """Florence2ForConditionalGeneration: DaViT vision (spatial window attention + channel group attention,
    depthwise conv position encodings), learned 2-D and temporal position embeddings, BART encoder-decoder."""
    vc = dict(depths=[1, 1], patch_size=[7, 3], patch_stride=[4, 2], patch_padding=[3, 1], patch_prenorm=[False, True],
              embed_dim=[16, 32], num_heads=[2, 4], num_groups=[2, 4], window_size=2, drop_path_rate=0.0,
              projection_dim=32, model_type="florence_vision")
    tc = dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
              encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=V, max_position_embeddings=64, dropout=0.0,
              attention_dropout=0.0, activation_dropout=0.0, model_type="bart")
    m = _vl(T.Florence2Config, T.Florence2ForConditionalGeneration,
            dict(vision_config=vc, text_config=tc, image_token_id=IMG_TOK), seed, device)
    ids = _vl_ids(17, seq=24)  # 8x8 -> 4x4 patches + 1 pooled token per image
    lab = torch.randint(11, V, (B, 8), generator=_g(6))
    return m, (ids,), {"pixel_values": _img(), "labels": lab}


VLM = ["mistral3", "idefics3", "smolvlm", "internvl", "aria", "got_ocr2", "kosmos2", "florence2"]


def depth_pro_model(seed=0, device="cpu"):
    """DepthProModel (encoder + fusion features, no heads): isolates depth_pro's tp=2 mismatch."""
    enc = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32,
               patch_size=8)
    m = _build(T.DepthProConfig, T.DepthProModel,
               dict(fusion_hidden_size=16, patch_size=32, intermediate_hook_ids=[1, 0], intermediate_feature_dims=[16, 16],
                    scaled_images_ratios=[0.5, 1.0], scaled_images_overlap_ratios=[0.0, 0.5],
                    scaled_images_feature_dims=[16, 16], image_model_config=dict(enc, model_type="dinov2"),
                    patch_model_config=dict(enc, model_type="dinov2"), fov_model_config=dict(enc, model_type="dinov2"),
                    use_fov_model=False), seed, device)
    return m, (_img(h=64, w=64),), {}


def depth_pro64(seed=0, device="cpu"):
    """depth_pro in float64 (model and image): tells a tp=2 rounding excess from a wrong program."""
    m, (x,), k = depth_pro(seed, device)
    return m.double(), (x.double(),), k


# ---------------------------------------------------------------- more patterns likely to break
def switch_transformers(seed=0, device="cpu"):
    """SwitchTransformersForConditionalGeneration: top-1 router with expert capacity (dropped tokens), router
    z-loss and aux loss; router_jitter_noise 0 (a random multiplicative noise in training, like dropout)."""
    m = _build(T.SwitchTransformersConfig, T.SwitchTransformersForConditionalGeneration,
               dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, num_experts=4,
                    num_sparse_encoder_layers=1, num_sparse_decoder_layers=1, expert_capacity=8, vocab_size=V,
                    router_jitter_noise=0.0, decoder_start_token_id=0), seed, device)
    ids = torch.randint(0, V, (B, S), generator=_g(1))
    return m, (ids,), {"labels": torch.randint(0, V, (B, 8), generator=_g(2))}


def olmoe(seed=0, device="cpu"):
    """OlmoeForCausalLM: 8 experts top-2 (defaults 64 / 8 made small), q/k norm."""
    ids = torch.randint(0, V, (B, S), generator=_g(1))
    m = _build(T.OlmoeConfig, T.OlmoeForCausalLM, dict(TXT, num_experts=8, num_experts_per_tok=2), seed, device)
    return m, (ids,), {"labels": ids}


def qwen2_vl(seed=0, device="cpu"):
    """Qwen2VLForConditionalGeneration: 3-D (multimodal) rotary, vision patch merger, cu_seqlens attention;
    one 16x16 image of patch 8 per sample: grid (1, 2, 2) -> 4 patches -> 1 token after 2x2 merge."""
    vc = dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, patch_size=8, spatial_merge_size=2,
              temporal_patch_size=1, in_channels=3, mlp_ratio=2)
    tc = dict(TXT, model_type="qwen2_vl_text", rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]},
              rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0})
    m = _vl(T.Qwen2VLConfig, T.Qwen2VLForConditionalGeneration,
            dict(vision_config=vc, text_config=tc, image_token_id=IMG_TOK, vision_start_token_id=11,
                 vision_end_token_id=12), seed, device)
    ids = _vl_ids(1, seq=S)
    pix = torch.randn(B * 4, 3 * 1 * 8 * 8, generator=_g(1))
    thw = torch.tensor([[1, 2, 2]] * B)
    return m, (ids,), {"pixel_values": pix, "image_grid_thw": thw, "labels": ids,
                       "mm_token_type_ids": (ids == IMG_TOK).long()}


def levit(seed=0, device="cpu"):
    """LevitForImageClassification: attention biases indexed from a table by relative offsets (attention_bias_idxs),
    shrinking attention (subsample), BatchNorm'd linears."""
    m = _build(T.LevitConfig, T.LevitForImageClassification,
               dict(image_size=32, hidden_sizes=[16, 32], num_attention_heads=[2, 4], depths=[1, 1], key_dim=[8, 8],
                    patch_size=16, down_ops=[["Subsample", 8, 2, 4, 2, 2]], mlp_ratio=[2, 2], attention_ratio=[2, 2],
                    num_labels=3), seed, device)
    return m, (_img(),), {"labels": torch.tensor([0, 1, 2, 1])}


def pvt_v2(seed=0, device="cpu"):
    """PvtV2ForImageClassification: spatial-reduction attention (strided conv on keys/values), depthwise conv FFN."""
    m = _build(T.PvtV2Config, T.PvtV2ForImageClassification,
               dict(depths=[1, 1], hidden_sizes=[8, 16], num_attention_heads=[1, 2], sr_ratios=[4, 2], patch_sizes=[7, 3],
                    strides=[4, 2], mlp_ratios=[2, 2], num_encoder_blocks=2, num_labels=3, image_size=32), seed, device)
    return m, (_img(),), {"labels": torch.tensor([0, 1, 2, 1])}


def hiera(seed=0, device="cpu"):
    """HieraForImageClassification: unroll / reroll of mask units (strided reshapes of the batch-merged tokens),
    query pooling by max over strides."""
    m = _build(T.HieraConfig, T.HieraForImageClassification,
               dict(embed_dim=8, image_size=[64, 64], patch_size=[7, 7], patch_stride=[4, 4], patch_padding=[3, 3],
                    depths=[1, 1, 1], num_heads=[1, 2, 2], masked_unit_size=[4, 4], num_labels=3,
                    query_stride=[2, 2]), seed, device)
    return m, (_img(h=64, w=64),), {"labels": torch.tensor([0, 1, 2, 1])}


def focalnet(seed=0, device="cpu"):
    """FocalNetForImageClassification: focal modulation (depthwise convs at growing kernels, gates), drop_path 0."""
    m = _build(T.FocalNetConfig, T.FocalNetForImageClassification,
               dict(embed_dim=8, hidden_sizes=[16, 32], depths=[1, 1], focal_levels=[2, 2], focal_windows=[3, 3],
                    image_size=32, patch_size=4, num_labels=3, drop_path_rate=0.0), seed, device)
    return m, (_img(),), {"labels": torch.tensor([0, 1, 2, 1])}


def efficientnet(seed=0, device="cpu"):
    """EfficientNetForImageClassification: depthwise convs, squeeze-excitation, BatchNorm; dropout and
    drop_connect 0."""
    m = _build(T.EfficientNetConfig, T.EfficientNetForImageClassification,
               dict(image_size=32, width_coefficient=0.25, depth_coefficient=0.2, hidden_dim=64, num_labels=3,
                    dropout_rate=0.0, drop_connect_rate=0.0), seed, device)
    return m, (_img(),), {"labels": torch.tensor([0, 1, 2, 1])}


MORE = ["switch_transformers", "olmoe", "qwen2_vl", "levit", "pvt_v2", "focalnet"]  # hiera, efficientnet: my sizes invalid


# ---------------------------------------------------------------- hand-written patterns
class _ConvPatterns(torch.nn.Module):
    """Dilated grouped conv, transposed grouped conv with output_padding, pixel_unshuffle / pixel_shuffle,
    interpolate by a non-integer factor (bicubic, antialias off), a relative position bias table gathered by offsets."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(8, 16, 3, padding=2, dilation=2, groups=4)
        self.t1 = torch.nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.c2 = torch.nn.Conv2d(32, 16, 1)
        self.table = torch.nn.Parameter(torch.randn(2 * 8 - 1, 4))
        idx = torch.arange(8)
        self.register_buffer("rel", (idx[:, None] - idx[None, :] + 7), persistent=False)
        self.q = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x):  # (B, 8, 16, 16)
        h = torch.nn.functional.gelu(self.c1(x))                       # (B, 16, 16, 16)
        h = self.t1(h)                                                 # (B, 8, 32, 32)
        h = torch.nn.functional.pixel_unshuffle(h, 2)                  # (B, 32, 16, 16)
        h = self.c2(h)                                                 # (B, 16, 16, 16)
        h = torch.nn.functional.interpolate(h, scale_factor=0.5, mode="bicubic", align_corners=False)  # (B,16,8,8)
        t = h.flatten(2).transpose(1, 2).reshape(h.shape[0], 8, 8, 16).mean(2)  # (B, 8, 16) tokens
        q = self.q(t).view(t.shape[0], 8, 4, 4).transpose(1, 2)       # (B, 4 heads, 8, 4)
        bias = self.table[self.rel].permute(2, 0, 1)                    # (4, 8, 8)
        att = (q @ q.transpose(-1, -2) + bias).softmax(-1) @ q          # (B, 4, 8, 4)
        return self.head(att.transpose(1, 2).reshape(t.shape[0], 8, 16).mean(1))


def conv_patterns(seed=0, device="cpu"):
    torch.manual_seed(seed)
    with torch.device(device):
        m = _ConvPatterns()
    return m, (torch.randn(B, 8, 16, 16, generator=_g(1)),), {}


class _CrossAttnMoE(torch.nn.Module):
    """Cross-attention of 6 queries over 10 keys (SDPA, another length), then a top-2 router over 4 experts
    with softmax gates and index_add dispatch (scatter), and an aux load-balance loss added to the output."""

    def __init__(self, d=16, e=4):
        super().__init__()
        self.q, self.kv = torch.nn.Linear(d, d), torch.nn.Linear(d, 2 * d)
        self.router = torch.nn.Linear(d, e, bias=False)
        self.w1 = torch.nn.Parameter(torch.randn(e, d, 2 * d) * 0.1)
        self.w2 = torch.nn.Parameter(torch.randn(e, 2 * d, d) * 0.1)
        self.e = e

    def forward(self, x, mem):  # (B, 6, d), (B, 10, d)
        b, n, d = x.shape
        k, v = self.kv(mem).chunk(2, -1)
        h = torch.nn.functional.scaled_dot_product_attention(
            self.q(x).view(b, n, 4, d // 4).transpose(1, 2), k.view(b, -1, 4, d // 4).transpose(1, 2),
            v.view(b, -1, 4, d // 4).transpose(1, 2)).transpose(1, 2).reshape(b, n, d)
        flat = h.reshape(-1, d)
        probs = self.router(flat).softmax(-1)
        gate, idx = probs.topk(2, -1)
        gate = gate / gate.sum(-1, keepdim=True)
        onehot = torch.nn.functional.one_hot(idx, self.e).to(flat.dtype)           # (N, 2, e)
        dispatch = (onehot * gate[..., None]).sum(1)                                # (N, e)
        expert_out = torch.einsum("nd,edf->nef", flat, self.w1).relu()
        expert_out = torch.einsum("nef,efd->ned", expert_out, self.w2)
        y = (expert_out * dispatch[..., None]).sum(1).view(b, n, d)
        aux = (probs.mean(0) * onehot.sum(1).mean(0)).sum() * self.e
        return y.pow(2).mean() + 0.01 * aux


def cross_attn_moe(seed=0, device="cpu"):
    torch.manual_seed(seed)
    with torch.device(device):
        m = _CrossAttnMoE()
    return m, (torch.randn(B, 6, 16, generator=_g(1)), torch.randn(B, 10, 16, generator=_g(2))), {}
