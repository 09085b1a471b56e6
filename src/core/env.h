/* The TS_* test and debug switches: hooks for tests and debugging, never settings (what
 * a user sets is a config key, validated with the others). Every one is read through
 * here, and README.md ("Test and debug switches") lists them. (One TS_* variable is a
 * user setting instead, and is not read here: TS_TOKENIZER_DIR, where the tokenizers'
 * ranks files are looked for, read by tokenizer/encoding.c beside model.tokenizer_file
 * and documented with it in CONTRACT.md "Environment".)
 *   TS_NO_BIND=1            bind no cores (a launcher's binding is still kept and named)
 *   TS_FAKE_NODES=K         pretend every K consecutive ranks share a node (topology)
 *   TS_FAKE_BLAS_CORE=NAME  pretend OpenBLAS chose core NAME (drives the re-execution)
 *   TS_PP_EXCHANGE=grouped  issue the pipeline's sends and receives as groups, as NCCL
 *                           needs, on any comm backend
 *   TS_PP_PAIRS=sequential  run a schedule's overlapped F/B pairs one action after the
 *                           other, as without expert parallelism (the paired run's
 *                           bit-for-bit reference)
 *   TS_TEST_SAVE_STALL_S=S  every rank waits S seconds mid-save, before the commit
 *   TS_TEST_INIT_STALL_S=S  every rank of an MPI command waits S seconds before MPI_Init
 *   TS_TEST_TOKENIZER_ANY_SIZE=1  a named encoding takes a ranks file of any size (the
 *                           tests' small fixture), its specials numbered from its size */
#ifndef TS_CORE_ENV_H
#define TS_CORE_ENV_H

typedef enum {
    TS_ENV_NO_BIND,
    TS_ENV_FAKE_NODES,
    TS_ENV_FAKE_BLAS_CORE,
    TS_ENV_PP_EXCHANGE,
    TS_ENV_TEST_SAVE_STALL_S,
    TS_ENV_TEST_INIT_STALL_S,
    TS_ENV_TEST_TOKENIZER_ANY_SIZE,
    TS_ENV_PP_PAIRS,
    TS_ENV_COUNT
} ts_env_switch;

/* The switch's value, or NULL when it is unset or empty. */
const char *ts_env(ts_env_switch s);

/* Its variable's name ("TS_NO_BIND"), for messages. */
const char *ts_env_name(ts_env_switch s);

#endif
