"""Trace monitors inside vLLM (a logits-processor plugin) and the arithmetic they share with the service.

* :mod:`ttc_monitor.args`: the per-request arguments (vLLM's ``vllm_xargs``, ``SamplingParams.extra_args``)
  that switch a monitor on, validated; pure Python.
* :mod:`ttc_monitor.window`: DeepConf's token and sliding-window group confidence; pure Python, the one
  implementation the service (finished samples, replay) and the engine (running traces) both use.
* :mod:`ttc_monitor.processor`: the vLLM logits processor (imports torch and vLLM; loaded by vLLM only).

Importing this package imports nothing of vLLM or torch.
"""

__version__ = "0.1.0"
