"""Critique-aware supervision: action labels, rationales, critic data, the critic service.

Modules:

* :mod:`.context` what an action could see (the grounding corpus) and the actions of a trajectory;
* :mod:`.rules` per-domain policy rules over the visible context (one module per domain);
* :mod:`.rationale` the rationale schema, the leakage check and the critique text format;
* :mod:`.labeller` labels every action (visible rules plus privileged gold/environment checks);
* :mod:`.gold` and :mod:`.gold_domains` gold trajectories built from a task's gold actions;
* :mod:`.inject` and :mod:`.inject_choices` trajectories with one deliberate error;
* :mod:`.teacher` natural-language rationales from a teacher LLM, leakage-checked;
* :mod:`.prompt` and :mod:`.datasets` the critic's prompt and its Parquet training data;
* :mod:`.verifier` the verification hook (``Verifier``, ``RuleVerifier``, ``ModelVerifier``);
* :mod:`.service` the batched critic service and its retrying client;
* :mod:`.metrics` detection metrics and correction/resistance from verification rounds.
"""
