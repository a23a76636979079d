"""Inference servers for the asynchronous mode: vLLM's own server started or given by URL (`server`, `keeper`,
`pool`), token-in/token-out generation with sticky routing and retries (`client`, `records`, `routing`, `outages`),
and the weight push (`weights`, `nccl`, `control`, `layout`; `receiver` runs inside vLLM's workers). Nothing is
imported here: the receiver's import must stay light."""
