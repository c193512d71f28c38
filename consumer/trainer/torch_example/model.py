"""The PyTorch example model: the default TensorFlow model's architecture
(consumer/trainer/model.py), for `--trainer torch`.

    tokens -> embedding + speaker and language embeddings
           -> n_layers x residual conv block (masked by text_lens)
           -> + sinusoidal positions = encoder memory [B, T, d]
    mel shifted right one frame -> prenet (dropout 0.5) -> + positions
           -> n_layers x (causal conv, cross-attention to the memory, feed-forward)
           -> linear to n_mels = predicted mel [B, F, n_mels] float32

Teacher forcing, causal decoder convs, the masked L1 loss over true frames; the
hyper-parameters are model.kwargs, checked as the default model's
(consumer/trainer/model_kwargs.py). Shapes are whatever the batch's bucket has.
"""

from __future__ import annotations

import torch
from torch import nn

from ringfeed.consumer.trainer.model_kwargs import DefaultModelKwargs

# As the TensorFlow model's (consumer/trainer/model.py): Tacotron 2's prenet dropout.
PRENET_DROPOUT = 0.5
N_HEADS = 4
FFN_MULT = 4


def positions(length: int, depth: int) -> torch.Tensor:
    """Sinusoidal position encoding [length, depth] (Vaswani et al. 2017, sec. 3.5)."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    i = torch.arange(depth // 2, dtype=torch.float64)[None, :]
    angle = pos / torch.pow(10000.0, 2 * i / depth)
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1).float()


def length_mask(lens: torch.Tensor, n: int) -> torch.Tensor:
    """[B, n] bool, True inside each row's true length."""
    return torch.arange(n, device=lens.device)[None, :] < lens[:, None]


class ConvBlock(nn.Module):
    """x + conv(x), normalized; causal: frame f sees frames <= f only."""

    def __init__(self, d: int, kernel: int, dropout: float, causal: bool) -> None:
        super().__init__()
        self.pad = (kernel - 1, 0) if causal else ((kernel - 1) // 2, kernel // 2)
        self.conv = nn.Conv1d(d, d, kernel)
        self.drop, self.norm = nn.Dropout(dropout), nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(nn.functional.pad(x.transpose(1, 2), self.pad)).transpose(1, 2)
        return self.norm(x + self.drop(torch.relu(y)))


class DecoderBlock(nn.Module):
    """Causal conv, cross-attention to the text, feed-forward; each residual, normalized."""

    def __init__(self, m: DefaultModelKwargs) -> None:
        super().__init__()
        d = m.d_model
        self.conv = ConvBlock(d, m.kernel_size, m.dropout, causal=True)
        self.attn = nn.MultiheadAttention(d, N_HEADS, dropout=m.dropout, batch_first=True)
        self.norm_attn, self.norm_ffn = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ffn = nn.Sequential(
            nn.Linear(d, FFN_MULT * d), nn.ReLU(), nn.Linear(FFN_MULT * d, d), nn.Dropout(m.dropout)
        )

    def forward(self, x: torch.Tensor, memory: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        y, _ = self.attn(x, memory, memory, key_padding_mask=padding, need_weights=False)
        x = self.norm_attn(x + y)
        return self.norm_ffn(x + self.ffn(x))


class TorchTTS(nn.Module):
    """Text (and who speaks, in which language) to mel, teacher-forced."""

    def __init__(
        self,
        vocab_size: int,
        n_mels: int,
        max_text: int,
        max_frames: int,
        max_speakers: int,
        max_languages: int,
        m: DefaultModelKwargs,
    ) -> None:
        super().__init__()
        d = m.d_model
        self.embed = nn.Embedding(vocab_size, d)
        self.speaker, self.language = nn.Embedding(max_speakers, d), nn.Embedding(max_languages, d)
        self.encoder = nn.ModuleList(
            ConvBlock(d, m.kernel_size, m.dropout, causal=False) for _ in range(m.n_layers)
        )
        self.prenet = nn.Sequential(
            nn.Linear(n_mels, d),
            nn.ReLU(),
            nn.Dropout(PRENET_DROPOUT),
            nn.Linear(d, d),
            nn.ReLU(),
            nn.Dropout(PRENET_DROPOUT),
        )
        self.decoder = nn.ModuleList(DecoderBlock(m) for _ in range(m.n_layers))
        self.out = nn.Linear(d, n_mels)
        self.register_buffer("text_pos", positions(max_text, d), persistent=False)
        self.register_buffer("frame_pos", positions(max_frames, d), persistent=False)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """batch: tokens [B, T], text_lens [B], mel [B, F, n_mels], speaker and
        language [B]; -> the predicted mel [B, F, n_mels]."""
        tokens, mel = batch["tokens"].long(), batch["mel"]
        # A padding row has no text: it attends to its first (zero) token, not to nothing
        # (a fully masked softmax is NaN, and its gradient poisons the batch's).
        text = length_mask(batch["text_lens"].clamp(min=1), tokens.shape[1])
        keep = text[:, :, None].to(mel.dtype)
        who = self.speaker(batch["speaker"].long()) + self.language(batch["language"].long())
        x = (self.embed(tokens) + who[:, None]) * keep
        for block in self.encoder:
            x = block(x) * keep
        memory = x + self.text_pos[: tokens.shape[1]]
        previous = nn.functional.pad(mel, (0, 0, 1, 0))[:, :-1]
        y = self.prenet(previous) + self.frame_pos[: mel.shape[1]]
        for block in self.decoder:
            y = block(y, memory, ~text)
        return self.out(y)


def masked_l1(pred: torch.Tensor, target: torch.Tensor, mel_lens: torch.Tensor) -> torch.Tensor:
    """Mean |pred - target| over true frames only (padding frames and rows excluded)."""
    frames = length_mask(mel_lens, target.shape[1])[:, :, None].to(pred.dtype)
    total = ((pred - target).abs() * frames).sum()
    return total / (frames.sum() * target.shape[2]).clamp(min=1.0)
