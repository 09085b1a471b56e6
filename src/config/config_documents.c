/* Packed documents' keys (data.document_mask, data.document_token; docs/CONTRACT.md
 * "data"): the document token they resolve to and its checks. */
#include <string.h>

#include "config/config_internal.h"

int ts_config_document_token(const ts_config *cfg)
{
    if (cfg->data.document_token >= 0) return cfg->data.document_token;
    /* tokenizer/tokenizer.h's ts_tokenizer_doc_token, without opening the ranks file
     * (test_config checks these values). */
    if (strcmp(cfg->model.tokenizer, "gpt2") == 0) return 50256;
    if (strcmp(cfg->model.tokenizer, "llama3") == 0) return 128000;
    return -1;
}

/* data.document_mask needs a document token the vocabulary holds. */
ts_status ts_config_validate_documents(const ts_config *cfg)
{
    const ts_data_config *d = &cfg->data;
    if (!d->document_mask) return TS_OK;
    const int tok = ts_config_document_token(cfg);
    if (tok < 0)
        return ts_fail("data.document_mask = true needs the token that starts each document: "
                       "model.tokenizer = \"\" (bare ids) has none, so give "
                       "data.document_token = ID (or set model.tokenizer)");
    if (tok >= cfg->model.vocab_size)
        return ts_fail("data.document_token = %d is not in the vocabulary (model.vocab_size = "
                       "%d)",
                       tok, cfg->model.vocab_size);
    return TS_OK;
}
