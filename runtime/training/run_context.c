/* What a hook may ask of the monitored session it runs in (TensorFlow's SessionRunContext):
 * request a stop, whether one is due, the step the session restored, its saver. Kept apart
 * from monitored_session.c, which calls the hooks, so that the hooks (hooks.c) do not call
 * back into the file that calls them. */
#include "training_impl.h"

static training_run_state *state(const dg_monitored_session *s) {
    return (training_run_state *)(void *)s;   // the first member (monitored_session.c)
}

bool dg_monitored_session_should_stop(const dg_monitored_session *s) {
    if (!s) return true;
    training_run_state *rs = state(s);   // atomics: loads do not modify
    return atomic_load(&rs->stop_requested) || atomic_load(&rs->last_run_failed) || atomic_load(&rs->closed);
}

void dg_monitored_session_request_stop(dg_monitored_session *s) {
    if (s) atomic_store(&state(s)->stop_requested, true);
}

int64_t dg_monitored_session_restored_step(const dg_monitored_session *s) {
    return s ? atomic_load(&state(s)->restored_step) : -1;
}

dg_saver *dg_monitored_session_saver(const dg_monitored_session *s) { return s ? state(s)->saver : NULL; }
