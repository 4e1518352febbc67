"""Tiny transformers models of families not tried before (trial h3). build(name) -> (model, args, kwargs)."""
import torch
import transformers as T

B, S, V = 4, 16, 128
D0 = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
BERTISH = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
               max_position_embeddings=64, **D0)


def _ids(v=V, s=S, b=B):
    return torch.randint(0, v, (b, s))


def _text(model_cls, config, v=V, s=S, labels=True):
    model = model_cls(config)
    ids = _ids(v, s)
    kw = {"labels": _ids(v, s)} if labels else {}
    return model, (ids,), kw


def _img(model_cls, config, size=32, labels=None, ch=3):
    model = model_cls(config)
    x = torch.randn(B, ch, size, size)
    return model, (x,), ({} if labels is None else {"labels": labels})


def _cls_labels(n=3):
    return torch.randint(0, n, (B,))


AUDIO = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8), num_conv_pos_embeddings=16,
             num_conv_pos_embedding_groups=4, hidden_dropout=0.0, activation_dropout=0.0, attention_dropout=0.0,
             feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0, num_labels=3,
             classifier_proj_size=16)


def _audio(model_cls, config):
    return model_cls(config), (torch.randn(B, 400),), {"labels": _cls_labels()}


def build(name: str, **_):
    torch.manual_seed(0)
    if name == "gptneo":
        c = T.GPTNeoConfig(vocab_size=V, max_position_embeddings=64, hidden_size=32, num_layers=2, num_heads=4,
                           attention_types=[[["global", "local"], 1]], window_size=4, intermediate_size=64,
                           embed_dropout=0.0, attention_dropout=0.0, resid_dropout=0.0)
        return _text(T.GPTNeoForCausalLM, c)
    if name == "ctrl":
        c = T.CTRLConfig(vocab_size=V, n_positions=64, n_embd=32, dff=64, n_layer=2, n_head=4, resid_pdrop=0.0,
                         embd_pdrop=0.0)
        return _text(T.CTRLLMHeadModel, c)
    if name == "xlm":
        c = T.XLMConfig(vocab_size=V, emb_dim=32, n_layers=2, n_heads=4, dropout=0.0, attention_dropout=0.0,
                        max_position_embeddings=64)
        return _text(T.XLMWithLMHeadModel, c)
    if name == "flaubert":
        c = T.FlaubertConfig(vocab_size=V, emb_dim=32, n_layers=2, n_heads=4, dropout=0.0, attention_dropout=0.0,
                             max_position_embeddings=64, layerdrop=0.0)
        return _text(T.FlaubertWithLMHeadModel, c)
    if name == "mpnet":
        return _text(T.MPNetForMaskedLM, T.MPNetConfig(**BERTISH, relative_attention_num_buckets=32))
    if name == "convbert":
        return _text(T.ConvBertForMaskedLM, T.ConvBertConfig(**BERTISH, embedding_size=32, conv_kernel_size=9))
    if name == "roformer":
        return _text(T.RoFormerForMaskedLM, T.RoFormerConfig(**BERTISH, embedding_size=32))
    if name == "squeezebert":
        c = T.SqueezeBertConfig(**BERTISH, embedding_size=32, q_groups=4, k_groups=4, v_groups=4,
                                post_attention_groups=1, intermediate_groups=4, output_groups=4)
        return _text(T.SqueezeBertForMaskedLM, c)
    if name == "ernie":
        return _text(T.ErnieForMaskedLM, T.ErnieConfig(**BERTISH))
    if name == "canine":
        c = T.CanineConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                           max_position_embeddings=64, downsampling_rate=4, num_hash_functions=4,
                           num_hash_buckets=64, local_transformer_stride=8, upsampling_kernel_size=4,
                           num_labels=3, **D0)
        model = T.CanineForSequenceClassification(c)
        return model, (torch.randint(0, 1000, (B, S)),), {"labels": _cls_labels()}
    if name == "nystromformer":
        c = T.NystromformerConfig(**BERTISH, segment_means_seq_len=S, num_landmarks=4, conv_kernel_size=3)
        return _text(T.NystromformerForMaskedLM, c)
    if name == "mra":
        return _text(T.MraForMaskedLM, T.MraConfig(**BERTISH, block_per_row=2, approx_mode="full"))
    if name == "yoso":
        return _text(T.YosoForMaskedLM, T.YosoConfig(**BERTISH))
    if name == "luke":
        c = T.LukeConfig(**BERTISH, entity_vocab_size=32, entity_emb_size=16)
        return _text(T.LukeForMaskedLM, c)
    if name == "rembert":
        c = T.RemBertConfig(**BERTISH, input_embedding_size=16, output_embedding_size=16)
        return _text(T.RemBertForMaskedLM, c)
    if name == "imagegpt":
        c = T.ImageGPTConfig(vocab_size=17, n_positions=S, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                             embd_pdrop=0.0, attn_pdrop=0.0)
        return _text(T.ImageGPTForCausalImageModeling, c, v=16)
    if name == "levit":
        c = T.LevitConfig(image_size=64, hidden_sizes=[32, 48, 64], num_attention_heads=[2, 3, 4], depths=[1, 1, 1],
                          key_dim=[8, 8, 8], num_labels=3, drop_path_rate=0)
        return _img(T.LevitForImageClassification, c, size=64, labels=_cls_labels())
    if name == "cvt":
        c = T.CvtConfig(embed_dim=[16, 32], num_heads=[1, 2], depth=[1, 2], patch_sizes=[7, 3], patch_stride=[4, 2],
                        patch_padding=[2, 1], mlp_ratio=[2.0, 2.0], attention_drop_rate=[0.0, 0.0],
                        drop_rate=[0.0, 0.0], drop_path_rate=[0.0, 0.0], qkv_bias=[True, True],
                        cls_token=[False, True], qkv_projection_method=["dw_bn", "dw_bn"], kernel_qkv=[3, 3],
                        padding_kv=[1, 1], stride_kv=[2, 2], padding_q=[1, 1], stride_q=[1, 1], num_labels=3)
        return _img(T.CvtForImageClassification, c, labels=_cls_labels())
    if name == "pvt":
        c = T.PvtConfig(image_size=32, num_encoder_blocks=2, depths=[1, 1], sequence_reduction_ratios=[2, 1],
                        hidden_sizes=[16, 32], patch_sizes=[4, 2], strides=[4, 2], num_attention_heads=[1, 2],
                        mlp_ratios=[2, 2], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        drop_path_rate=0.0, num_labels=3)
        return _img(T.PvtForImageClassification, c, labels=_cls_labels())
    if name == "pvtv2":
        c = T.PvtV2Config(image_size=32, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                          patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0, num_labels=3)
        return _img(T.PvtV2ForImageClassification, c, labels=_cls_labels())
    if name == "poolformer":
        c = T.PoolFormerConfig(num_encoder_blocks=2, depths=[1, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3],
                               strides=[4, 2], padding=[2, 1], drop_path_rate=0.0, hidden_dropout_prob=0.0, num_labels=3)
        return _img(T.PoolFormerForImageClassification, c, labels=_cls_labels())
    if name == "focalnet":
        c = T.FocalNetConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], focal_levels=[2, 2],
                             focal_windows=[3, 3], hidden_dropout_prob=0.0, drop_path_rate=0.0, num_labels=3)
        return _img(T.FocalNetForImageClassification, c, labels=_cls_labels())
    if name == "glpn":
        c = T.GLPNConfig(num_encoder_blocks=4, depths=[1, 1, 1, 1], sr_ratios=[4, 2, 1, 1], hidden_sizes=[8, 16, 16, 32],
                         patch_sizes=[7, 3, 3, 3], strides=[4, 2, 2, 2], num_attention_heads=[1, 2, 2, 4],
                         mlp_ratios=[2, 2, 2, 2], decoder_hidden_size=16, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0, drop_path_rate=0.0)
        model = T.GLPNForDepthEstimation(c)
        return model, (torch.randn(B, 3, 64, 64),), {"labels": torch.rand(B, 64, 64) + 0.1}
    if name == "dpt":
        c = T.DPTConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64, image_size=32,
                        patch_size=8, backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[8, 16, 16, 32],
                        fusion_hidden_size=16, head_in_index=-1, **D0)
        return _img(T.DPTForDepthEstimation, c)
    if name == "mobilenetv2":
        c = T.MobileNetV2Config(image_size=32, depth_multiplier=0.25, num_labels=3, classifier_dropout_prob=0.0)
        return _img(T.MobileNetV2ForImageClassification, c, labels=_cls_labels())
    if name == "bit":
        c = T.BitConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=3, drop_path_rate=0.0, num_groups=8)
        return _img(T.BitForImageClassification, c, labels=_cls_labels())
    if name == "groupvit":
        c = T.GroupViTVisionConfig(hidden_size=32, intermediate_size=64, depths=[1, 1], num_group_tokens=[4, 0],
                                   num_output_groups=[4, 2], num_attention_heads=4, image_size=32, patch_size=8,
                                   dropout=0.0, attention_dropout=0.0)
        return _img(T.GroupViTVisionModel, c)
    if name == "owlv2":
        c = T.Owlv2VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                image_size=32, patch_size=8, attention_dropout=0.0)
        return _img(T.Owlv2VisionModel, c)
    if name == "hubert":
        return _audio(T.HubertForSequenceClassification, T.HubertConfig(**AUDIO))
    if name == "wavlm":
        return _audio(T.WavLMForSequenceClassification, T.WavLMConfig(**AUDIO, num_buckets=32, max_bucket_distance=64))
    if name == "unispeech":
        return _audio(T.UniSpeechForSequenceClassification, T.UniSpeechConfig(**AUDIO))
    if name in ("w2v2conformer_rel", "w2v2conformer_rot"):
        c = T.Wav2Vec2ConformerConfig(**AUDIO, conv_depthwise_kernel_size=3,
                                      position_embeddings_type="relative" if name.endswith("rel") else "rotary")
        return _audio(T.Wav2Vec2ConformerForSequenceClassification, c)
    if name in ("timeseries", "informer"):
        kw = dict(prediction_length=4, context_length=8, lags_sequence=[1, 2], num_time_features=1, d_model=16,
                  encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                  encoder_ffn_dim=32, decoder_ffn_dim=32, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                  encoder_layerdrop=0.0, decoder_layerdrop=0.0)
        if name == "timeseries":
            model = T.TimeSeriesTransformerForPrediction(T.TimeSeriesTransformerConfig(**kw))
        else:
            model = T.InformerForPrediction(T.InformerConfig(**kw))
        past = 8 + 2
        kwargs = dict(past_time_features=torch.randn(B, past, 1), past_observed_mask=torch.ones(B, past),
                      future_values=torch.randn(B, 4), future_time_features=torch.randn(B, 4, 1))
        return model, (torch.randn(B, past),), kwargs
    if name == "decision":
        c = T.DecisionTransformerConfig(state_dim=5, act_dim=3, hidden_size=32, n_layer=2, n_head=4, max_ep_len=64,
                                        n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = T.DecisionTransformerModel(c)
        s = 8
        kwargs = dict(actions=torch.randn(B, s, 3), rewards=torch.randn(B, s, 1), returns_to_go=torch.randn(B, s, 1),
                      timesteps=torch.randint(0, 64, (B, s)), attention_mask=torch.ones(B, s, dtype=torch.long))
        return model, (torch.randn(B, s, 5),), kwargs
    if name == "trocr":
        c = T.TrOCRConfig(vocab_size=V, d_model=32, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=64,
                          max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                          decoder_layerdrop=0.0)
        return _text(T.TrOCRForCausalLM, c)
    if name == "pix2struct":
        c = T.Pix2StructVisionConfig(hidden_size=32, patch_embed_hidden_size=12, d_ff=64, d_kv=8, num_attention_heads=4,
                                     num_hidden_layers=2, dropout_rate=0.0, attention_dropout=0.0, seq_len=16)
        model = T.Pix2StructVisionModel(c)
        rows = torch.arange(16).div(4, rounding_mode="floor").float() + 1
        cols = torch.arange(16).remainder(4).float() + 1
        fp = torch.cat([rows[None, :, None].expand(B, 16, 1), cols[None, :, None].expand(B, 16, 1),
                        torch.randn(B, 16, 12)], -1)
        return model, (fp,), {}
    if name == "blip2":
        c = T.Blip2VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                image_size=32, patch_size=8, attention_dropout=0.0)
        return _img(T.Blip2VisionModel, c)
    if name == "kosmos2":
        c = T.Kosmos2VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  image_size=32, patch_size=8, attention_dropout=0.0, dropout=0.0)
        from transformers.models.kosmos2.modeling_kosmos2 import Kosmos2VisionModel
        return _img(Kosmos2VisionModel, c)
    raise KeyError(name)


NAMES = ["gptneo", "ctrl", "xlm", "flaubert", "mpnet", "convbert", "roformer", "squeezebert", "ernie", "canine",
         "nystromformer", "mra", "yoso", "luke", "rembert", "imagegpt", "levit", "cvt", "pvt", "pvtv2", "poolformer",
         "focalnet", "glpn", "dpt", "mobilenetv2", "bit", "groupvit", "owlv2", "hubert", "wavlm", "unispeech",
         "w2v2conformer_rel", "w2v2conformer_rot", "timeseries", "informer", "decision", "trocr", "pix2struct",
         "blip2", "kosmos2"]
