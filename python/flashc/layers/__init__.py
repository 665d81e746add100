"""flashc.layers : helpers under the module names flash_attn gives them (layers.rotary)."""
