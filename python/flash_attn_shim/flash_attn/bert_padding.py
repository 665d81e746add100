"""flash_attn.bert_padding, made of flashc: flashc.bert_padding's names."""
from flashc.bert_padding import *  # noqa: F401,F403
from flashc.bert_padding import __all__  # noqa: F401
