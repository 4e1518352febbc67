"""CLI factories (`parallelizer plan --model trial.factories:NAME`)."""
import torch
import transformers as T


def llama(batch=8, seq_len=16, **kw):
    cfg = T.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    m = T.LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (batch, seq_len), generator=g)
    labels = ids.clone(); labels[: batch // 4, 3:] = -100
    return m, (ids,), {"labels": labels}


def bert_cls(batch=8, seq_len=16, **kw):
    cfg = T.BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
                       max_position_embeddings=32, num_labels=3, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.0)
    m = T.BertForSequenceClassification(cfg)
    ids = torch.randint(0, 128, (batch, seq_len), generator=torch.Generator().manual_seed(1))
    return m, (ids,), {"labels": torch.arange(batch) % 3}
