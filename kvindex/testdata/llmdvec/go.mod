module llmdvec

go 1.26

require github.com/llm-d/llm-d-kv-cache v0.9.0
