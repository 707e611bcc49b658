"""Studies: questions about models that trajscope answers with its own engine, each a function, a command
and Parquet tables.

- :mod:`trajscope.studies.eviction`: do the prompt keys that a KV-eviction policy keeps after prefill
  stay the ones decode attends to, and what does evicting the rest cost the next-token distribution?
"""
