/* Human-readable messages go to stderr. Rank 0 prints by default so a message
 * appears once per job; ts_log_any prints from any rank with its rank prefixed. */
#ifndef TS_LOG_H
#define TS_LOG_H

void ts_log_set_rank(int rank);
int ts_log_rank(void);
void ts_log_set_quiet(int quiet);

void ts_log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));  /* rank 0 only */
void ts_log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));  /* rank 0 only */
void ts_log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2))); /* rank 0 only */
void ts_log_any(const char *fmt, ...) __attribute__((format(printf, 1, 2)));   /* every rank */

#endif
