"""Trial h1 part 2: DEFAULT transformers configs (only the layer count cut to 2) built on meta, traced and
planned on h100:1x8 with mesh dp=2 x tp=4. Records trace / plan seconds or the error."""
import contextlib, io, json, sys, time, traceback, warnings
import torch
import transformers as T
import parallelizer

CASES = {  # name: (config class, model class, layer keys, input kind)
    "llama": ("LlamaConfig", "LlamaForCausalLM", ["num_hidden_layers"], "ids"),
    "helium": ("HeliumConfig", "HeliumForCausalLM", ["num_hidden_layers"], "ids"),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", ["num_hidden_layers"], "ids"),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", ["num_hidden_layers"], "ids"),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", ["num_hidden_layers"], "ids"),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", ["num_hidden_layers"], "ids"),
    "glm4moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", ["num_hidden_layers"], "ids"),
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", ["num_hidden_layers"], "ids"),
    "xglm": ("XGLMConfig", "XGLMForCausalLM", ["num_layers"], "ids"),
    "biogpt": ("BioGptConfig", "BioGptForCausalLM", ["num_hidden_layers"], "ids"),
    "mbart": ("MBartConfig", "MBartForConditionalGeneration", ["encoder_layers", "decoder_layers"], "s2s"),
    "m2m100": ("M2M100Config", "M2M100ForConditionalGeneration", ["encoder_layers", "decoder_layers"], "s2s"),
    "mt5": ("MT5Config", "MT5ForConditionalGeneration", ["num_layers", "num_decoder_layers"], "s2s"),
    "bert": ("BertConfig", "BertForMaskedLM", ["num_hidden_layers"], "ids"),
    "modernbert": ("ModernBertConfig", "ModernBertForMaskedLM", ["num_hidden_layers"], "ids"),
    "vit": ("ViTConfig", "ViTForImageClassification", ["num_hidden_layers"], "img"),
    "convnext": ("ConvNextConfig", "ConvNextForImageClassification", [], "img"),
    "wav2vec2": ("Wav2Vec2Config", "Wav2Vec2ForCTC", ["num_hidden_layers"], "audio_ctc"),
    "whisper": ("WhisperConfig", "WhisperForConditionalGeneration", ["encoder_layers", "decoder_layers"], "whisper"),
    "moonshine": ("MoonshineConfig", "MoonshineForConditionalGeneration", ["encoder_num_hidden_layers", "decoder_num_hidden_layers"], "moonshine"),
    "speech2text": ("Speech2TextConfig", "Speech2TextForConditionalGeneration", ["encoder_layers", "decoder_layers"], "s2t"),
}
B, S = 8, 512


def build(name, device="meta"):
    cc, mc, keys, kind = CASES[name]
    config = getattr(T, cc)(**{k: 2 for k in keys})
    with torch.device(device):
        model = getattr(T, mc)(config)
    V = getattr(config, "vocab_size", 1000) or 1000
    ids = torch.randint(0, V, (B, S), device=device)
    if kind == "ids":
        return model, (ids,), {"labels": ids}
    if kind == "s2s":
        return model, (ids,), {"labels": ids}
    if kind == "img":
        n = getattr(config, "num_labels", 2)
        return model, (torch.randn(B, 3, config.image_size, config.image_size, device=device),), {"labels": torch.randint(0, n, (B,), device=device)}
    if kind == "audio_ctc":
        return model, (torch.randn(B, 16000, device=device),), {"labels": torch.randint(1, V, (B, 20), device=device)}
    if kind == "whisper":
        return model, (torch.randn(B, config.num_mel_bins, 3000, device=device),), {"labels": torch.randint(0, V, (B, 32), device=device)}
    if kind == "moonshine":
        return model, (torch.randn(B, 16000, device=device),), {"labels": torch.randint(0, V, (B, 32), device=device)}
    if kind == "s2t":
        return model, (torch.randn(B, 200, config.input_feat_per_channel * config.input_channels, device=device),), {"labels": torch.randint(0, V, (B, 32), device=device)}


if __name__ == "__main__":
    rows = []
    for name in sys.argv[1:] or list(CASES):
        row = {"model": name}
        try:
            m, a, k = build(name)
        except Exception as e:
            row["result"] = f"build {type(e).__name__}: {str(e)[:300]}"; rows.append(row); print(json.dumps(row), flush=True); continue
        t = time.time()
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                traced = parallelizer.trace(m, a, k)
            row["trace_s"] = round(time.time() - t, 1); row["nodes"] = len(traced.nodes)
        except Exception as e:
            row["trace_s"] = round(time.time() - t, 1)
            row["result"] = f"trace {type(e).__module__}.{type(e).__name__}: {str(e)[:500]}"
            row["tb"] = traceback.format_exc()[-1200:]
            rows.append(row); print(json.dumps(row), flush=True); continue
        t = time.time()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                plan = parallelizer.plan(traced, {"dp": 2, "tp": 4}, cluster="h100:1x8")
            row["plan_s"] = round(time.time() - t, 1); row["result"] = "planned"
        except Exception as e:
            row["plan_s"] = round(time.time() - t, 1)
            row["result"] = f"plan {type(e).__module__}.{type(e).__name__}: {str(e)[:500]}"
            row["tb"] = traceback.format_exc()[-1200:]
        rows.append(row); print(json.dumps(row), flush=True)
    json.dump(rows, open("trial/h1_defaults_results.json" if len(sys.argv) < 2 else f"trial/h1_defaults_{'_'.join(sys.argv[1:])[:50]}.json", "w"), indent=1)
