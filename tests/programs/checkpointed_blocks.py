# A model whose blocks run under activation checkpointing, non-reentrant (torch.utils.checkpoint.checkpoint
# with use_reentrant=False, as transformers' gradient_checkpointing_enable() and TRL's SFTConfig default use it:
# https://pytorch.org/docs/stable/checkpoint.html). Its recomputation in backward stops early, by raising inside
# a module's forward once the tensors backward needs are back. The same batch every step, three AdamW steps.
import torch
from torch.utils.checkpoint import checkpoint


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.proj = torch.nn.Linear(8, 32), torch.nn.Linear(32, 8)

    def forward(self, x):
        return x + self.proj(torch.nn.functional.gelu(self.fc(x)))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(2))
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(x).pow(2).mean()


torch.manual_seed(0)
net, batch = Net(), torch.randn(4, 8)
optimizer = torch.optim.AdamW(net.parameters())
for _ in range(3):
    net(batch).backward()
    optimizer.step()
    optimizer.zero_grad()
