"""Writes <family>.v<major>.json: config.json as transformers itself saves it, for the tiny models of
tests/python/test_hf_models.py. Run once per transformers major (4.57.6 and 5.23.0 made these):
    python make_configs.py
"""
import json
import pathlib
import tempfile

import transformers
from transformers import AutoConfig

from tiny_models import FAMILIES, config_kwargs

major = transformers.__version__.split(".")[0]
here = pathlib.Path(__file__).parent
for family in FAMILIES:
    cfg = AutoConfig.for_model(family, **config_kwargs(family))
    with tempfile.TemporaryDirectory() as tmp:
        cfg.save_pretrained(tmp)
        d = json.loads((pathlib.Path(tmp) / "config.json").read_text())
    d.pop("transformers_version", None)
    (here / f"{family}.v{major}.json").write_text(json.dumps(d, indent=1, sort_keys=True) + "\n")
    print(family, "->", f"{family}.v{major}.json")
