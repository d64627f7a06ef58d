/* fumarole's decision core, for schedulers that link it (libfumarole_scheduler_abi.a).
 * Written by hand from scheduler-abi/src/lib.rs, which documents each function.
 * Objects travel as JSON; strings returned in *out are freed with fumarole_string_free. */
#ifndef FUMAROLE_SCHEDULER_H
#define FUMAROLE_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#define FUMAROLE_OK 0        /* done; *out holds the result, or NULL */
#define FUMAROLE_NOT_OURS 1  /* the task asks for no device fumarole serves */
#define FUMAROLE_ERROR 2     /* refused: *out holds why */
#define FUMAROLE_PANIC 3     /* a bug, stopped at the edge: *out holds the message */

typedef struct fumarole_engine fumarole_engine;

fumarole_engine *fumarole_engine_start(const uint8_t *config, size_t len, char **error);
fumarole_engine *fumarole_engine_over_snapshot(const uint8_t *dir, size_t dir_len,
                                               const uint8_t *conf, size_t conf_len,
                                               char **error);
int fumarole_engine_notes(const fumarole_engine *engine, char **out);
int fumarole_task_evaluate(const fumarole_engine *engine, const uint8_t *pod, size_t len,
                           uint64_t known_generation, char **out);
/* A task's verdicts per node, in the view's node order; freed with fumarole_verdicts_free. */
typedef struct fumarole_verdicts {
  size_t len;
  uint8_t *codes;   /* 0 fits, 2 unschedulable, 3 unresolvable */
  double *scores;   /* on Volcano's scale; 0 where the node does not fit */
  int32_t *reasons; /* index of the node's R line, -1 where it fits */
} fumarole_verdicts;
int fumarole_task_evaluate_arrays(const fumarole_engine *engine, const uint8_t *pod, size_t len,
                                  uint64_t known_generation, char **out,
                                  fumarole_verdicts *verdicts);
void fumarole_verdicts_free(fumarole_verdicts *verdicts);
int fumarole_task_allocate(const fumarole_engine *engine, const uint8_t *pod, size_t len,
                           const uint8_t *node, size_t node_len, char **error);
int fumarole_engine_write_choices_at_prebind(const fumarole_engine *engine, char **error);
int fumarole_task_prebind(const fumarole_engine *engine, const uint8_t *pod, size_t len,
                          const uint8_t *node, size_t node_len, char **error);
int fumarole_task_write_choice(const fumarole_engine *engine, const uint8_t *pod, size_t len,
                               const uint8_t *node, size_t node_len, char **error);
int fumarole_task_bind(const fumarole_engine *engine, const uint8_t *pod, size_t len,
                       const uint8_t *node, size_t node_len, char **error);
int fumarole_task_deallocate(const fumarole_engine *engine, const uint8_t *pod, size_t len,
                             char **error);
int fumarole_task_give_up_plan(const fumarole_engine *engine, const uint8_t *pod, size_t len,
                               char **out);
uint64_t fumarole_engine_device_views(const fumarole_engine *engine);
uint64_t fumarole_engine_room_freed(const fumarole_engine *engine);
void fumarole_string_free(char *s);
void fumarole_engine_free(fumarole_engine *engine);

#endif
