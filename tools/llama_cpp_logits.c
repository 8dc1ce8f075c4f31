/* The logits of every position of a prompt of token ids, as llama.cpp computes them (float32 KV cache,
   no flash attention, one thread): llama_cpp_logits model.gguf out.f32 id id ... (tools/llama_cpp_check.py) */
#include <stdio.h>
#include <stdlib.h>
#include "llama.h"

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    int n = argc - 3;
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 64; cp.n_batch = 64; cp.n_ubatch = 64; cp.n_threads = 1; cp.n_threads_batch = 1; cp.type_k = GGML_TYPE_F32; cp.type_v = GGML_TYPE_F32; cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "context failed\n"); return 1; }
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    struct llama_batch b = llama_batch_init(n, 0, 1);
    b.n_tokens = n;
    for (int i = 0; i < n; i++) {
        b.token[i] = atoi(argv[3 + i]); b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1;
    }
    if (llama_decode(ctx, b) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
    FILE *f = fopen(argv[2], "wb");
    for (int i = 0; i < n; i++) fwrite(llama_get_logits_ith(ctx, i), sizeof(float), n_vocab, f);
    fclose(f);
    llama_batch_free(b); llama_free(ctx); llama_model_free(model);
    return 0;
}
