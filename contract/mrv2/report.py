"""The `--speculative-config` method name of each MRV2 speculator kind, as the reproductions on
the MRV2 pages write it."""

from __future__ import annotations

from contract.scenario import Speculator

METHOD = {Speculator.EAGLE: "eagle", Speculator.MULTI_MODULE_MTP: "mtp", Speculator.DFLASH: "dflash",
          Speculator.STANDALONE_AR: "draft_model"}
