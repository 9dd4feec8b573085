"""The names of what ``/metrics`` exports, shared by their producers (:mod:`lamina.server.metrics`,
:mod:`lamina.kernel.slo`) and their readers (``lamina status``, ``lamina ab report``).

They follow vLLM's under a ``lamina_`` prefix. Counters are named without ``_total``: a scrape
shows ``REQUESTS + "_total"``, histograms ``TTFT + "_bucket"``.
"""

from __future__ import annotations

REQUESTS = "lamina_requests"
REQUEST_SUCCESS = "lamina_request_success"
REQUEST_ABORTS = "lamina_request_aborts"
PROMPT_TOKENS = "lamina_prompt_tokens"
GENERATION_TOKENS = "lamina_generation_tokens"
ROUTE_TREE_REQUESTS = "lamina_route_tree_requests"

TTFT = "lamina_time_to_first_token_seconds"
ITL = "lamina_inter_token_latency_seconds"
E2E = "lamina_e2e_request_latency_seconds"
QUEUE_TIME = "lamina_request_queue_time_seconds"

NUM_REQUESTS_WAITING = "lamina_num_requests_waiting"
NUM_REQUESTS_RUNNING = "lamina_num_requests_running"
KV_CACHE_USAGE = "lamina_kv_cache_usage_perc"
KV_CACHE_BLOCKS_USED = "lamina_kv_cache_blocks_used"
KV_CACHE_BLOCKS_TOTAL = "lamina_kv_cache_blocks_total"
PREEMPTIONS = "lamina_num_preemptions"
SPEC_DECODE_DRAFT_TOKENS = "lamina_spec_decode_num_draft_tokens"
SPEC_DECODE_ACCEPTED_TOKENS = "lamina_spec_decode_num_accepted_tokens"

BACKEND_UP = "lamina_backend_up"
BACKEND_CIRCUIT_OPEN = "lamina_backend_circuit_open"
BACKEND_OUTSTANDING = "lamina_backend_outstanding_requests"
BACKEND_QUEUE_DEPTH = "lamina_backend_queue_depth"
BACKEND_KV_USAGE = "lamina_backend_kv_usage_perc"
BACKEND_TOKENS_PER_S = "lamina_backend_generation_tokens_per_second"

REPLICAS = "lamina_replicas"
AUTOSCALER_TARGET = "lamina_autoscaler_target_replicas"
REPLICA_COLD_START = "lamina_replica_cold_start_seconds"
REPLICA_ACTIONS = "lamina_replica_actions"

SLO_THRESHOLD = "lamina_slo_threshold"
SLO_ERROR_BUDGET = "lamina_slo_error_budget"
SLO_EVENTS = "lamina_slo_events"
SLO_BAD_EVENTS = "lamina_slo_bad_events"
SLO_BURN_RATE = "lamina_slo_burn_rate"
