"""Fakes for tests, demos and benchmarks: a fake OpenAI backend (:mod:`.backend`) and a fake ttc
service (:mod:`.service`)."""
