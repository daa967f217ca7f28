"""Published-weight files and PyTorch's logits for kiln's loader (tests/io/test_pretrained.cpp, PretrainedGolden).

    python3 tests/golden/make_golden_pretrained.py /tmp/kiln_pretrained
    KILN_PRETRAINED_DIR=/tmp/kiln_pretrained ./build/tests/test_io --gtest_filter='PretrainedGolden*'

Needs torch, torchvision and transformers; no network (the models are built from configs with fixed seeds, and
every parameter is perturbed so that LayerNorm/BatchNorm weights and biases are not their 1/0 defaults). Writes:
  resnet18.pth           torch.save(torchvision.models.resnet18(num_classes=10).state_dict()), BatchNorm running
                         statistics filled by three training-mode batches
  bert_mlm.pth           torch.save(BertForMaskedLM(config).state_dict()) (hidden 64, 2 layers, 4 heads, vocab 100)
  bert_model.pth         torch.save(that model's .bert.state_dict()) (a BertModel's names, no "bert." prefix)
  bert_mlm/              save_pretrained(safe_serialization=True): model.safetensors + config.json
  expected.pth           torch.save({"resnet": {"input", "logits"}, "bert": {"input_ids", "token_type_ids",
                         "attention_mask", "logits"}}): eval-mode float32 logits computed on the CPU
"""
import os
import sys

import torch
import torchvision
from transformers import BertConfig, BertForMaskedLM


def perturb(model, scale):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)

    resnet = torchvision.models.resnet18(num_classes=10)
    perturb(resnet, 0.05)
    resnet.train()
    with torch.no_grad():
        for _ in range(3):
            resnet(torch.randn(4, 3, 64, 64) * 2 + 0.5)
    resnet.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        resnet_logits = resnet(x)
    torch.save(resnet.state_dict(), os.path.join(out, "resnet18.pth"))

    config = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=32, type_vocab_size=2, hidden_act="gelu",
                        layer_norm_eps=1e-12, pad_token_id=0)
    mlm = BertForMaskedLM(config)
    perturb(mlm, 0.1)
    mlm.eval()
    input_ids = torch.randint(1, 100, (2, 8))
    token_type_ids = torch.zeros(2, 8, dtype=torch.int64)
    token_type_ids[:, 5:] = 1
    attention_mask = torch.ones(2, 8, dtype=torch.int64)
    attention_mask[1, 5:] = 0  # the second sequence has 3 padding tokens
    input_ids[1, 5:] = 0
    with torch.no_grad():
        bert_logits = mlm(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask).logits
    torch.save(mlm.state_dict(), os.path.join(out, "bert_mlm.pth"))
    torch.save(mlm.bert.state_dict(), os.path.join(out, "bert_model.pth"))
    mlm.save_pretrained(os.path.join(out, "bert_mlm"), safe_serialization=True)

    torch.save({"resnet": {"input": x, "logits": resnet_logits},
                "bert": {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask,
                         "logits": bert_logits}},
               os.path.join(out, "expected.pth"))
    print(f"wrote {out}: resnet logits {tuple(resnet_logits.shape)}, bert logits {tuple(bert_logits.shape)}, "
          f"max |logit| {resnet_logits.abs().max():.3f} / {bert_logits.abs().max():.3f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
