"""The model boundary: the only code in trajscope that runs a model.

:class:`ModelHandle` opens a model through nnsight (:func:`load_model`) and
offers every model operation the rest of trajscope needs, each under the
model's lock, with family knowledge (module paths, tuple outputs) kept inside
this package:

- :meth:`ModelHandle.generation` — the generation trace with per-step kernels
  and steering (what :func:`trajscope.capture` drives);
- :meth:`ModelHandle.forward` — a teacher-forced forward with steering, reads
  of chosen layers, an SAE splice, and an explicit key mask per layer and head;
- :meth:`ModelHandle.read_residuals` — block outputs at chosen positions;
- :meth:`ModelHandle.generate_ids` — plain Hugging Face generation (a reference engine);
- :meth:`ModelHandle.greedy_batch` — greedy decoding of a padded batch (batched capture);
- :meth:`ModelHandle.prefill_chunks`, :meth:`ModelHandle.forward_batch` and
  :meth:`ModelHandle.prefix_cache` / ``forward(..., past=)`` — chunked prefill,
  a batch with padding and reuse of a precomputed prefix cache;
- :meth:`ModelHandle.masked_decode` — greedy decode with evicted keys hidden.

Nothing outside this package imports nnsight or calls the raw Hugging Face
module (tests may, as independent references).
"""

from trajscope.model.families import FAMILIES, Family, family_for
from trajscope.model.forward import ForwardResult
from trajscope.model.handle import ModelHandle
from trajscope.model.gguf_cache import SMOLLM2, cache_root
from trajscope.model.load import SAMPLE_MODEL, available_models, load_model, sample_data_dir

__all__ = ["ModelHandle", "ForwardResult", "load_model", "sample_data_dir", "SAMPLE_MODEL", "SMOLLM2",
           "available_models", "cache_root", "Family", "FAMILIES",
           "family_for"]
