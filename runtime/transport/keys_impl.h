/* A cluster's CurveZMQ keys, read from a key directory (docs/SECURITY.md, "Keys"):
 *
 *   DIR/<host>_<port>.key   the key pair of the task serving host:port (mode 0600)
 *   DIR/<host>_<port>.pub   ... its public key alone (what other machines need)
 *   DIR/<name>.key, .pub    other members: clients ("client" by default)
 *
 * A .key file holds two lines, "public <z85>" and "secret <z85>"; a .pub file the first. The
 * directory must belong to this user and be writable by nobody else; .key files must be this
 * user's with no permission for group or others. Every public key in the directory (of .pub
 * and .key files) is a member: a task admits exactly those (its allow-list), and a client
 * finds the key of the task it connects to by the task's address. */
#ifndef DG_KEYS_IMPL_H
#define DG_KEYS_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "distgraph/status.h"

#define RT_KEY_Z85 41   // a Z85 key with its NUL

typedef struct rt_keyring rt_keyring;

// Reads dir. Returns: new, free with rt_keyring_free; NULL with st set (naming the file and
// what is wrong with it: permissions, owner, contents).
rt_keyring *rt_keyring_load(const char *dir, dg_status *st);
void rt_keyring_free(rt_keyring **k);
const char *rt_keyring_dir(const rt_keyring *k);
// The key pair DIR/<name>.key. false with st set when it is missing or unsafe.
bool rt_keyring_pair(const rt_keyring *k, const char *name, char pub[RT_KEY_Z85], char sec[RT_KEY_Z85],
                     dg_status *st);
// The public key of the task at endpoint "tcp://host:port" (DIR/<host>_<port>.pub or .key).
bool rt_keyring_server_key(const rt_keyring *k, const char *endpoint, char pub[RT_KEY_Z85], dg_status *st);
// Whether a peer's 32-byte public key is a member.
bool rt_keyring_allows(const rt_keyring *k, const uint8_t key[32]);
int rt_keyring_size(const rt_keyring *k);
// The file name stem of the task at "host:port" or "tcp://host:port": "host_port".
void rt_key_name_of(const char *address, char *out, size_t cap);
// Creates DIR (mode 0700) if needed and writes a fresh key pair as DIR/<name>.key (0600) and
// DIR/<name>.pub (0644). Refuses to overwrite.
bool rt_keyring_generate(const char *dir, const char *name, dg_status *st);

#endif
