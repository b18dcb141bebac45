"""The stable import path of the attention contract: `from relpos_lab.attention import
relative_attention`. The implementations live in relpos_lab/core/attention/."""
from relpos_lab.core.attention import IMPLS, relative_attention

__all__ = ["IMPLS", "relative_attention"]
