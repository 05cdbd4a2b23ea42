/* Key directories (keys_impl.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "keys_impl.h"
#include "status_impl.h"

struct rt_keyring {
    char *dir;
    uint8_t (*members)[32];
    int n_members;
};

#define MAX_KEY_FILE 256
#define MAX_MEMBERS 100000

static bool is_z85_key(const char *s) {
    if (strlen(s) != 40) return false;
    uint8_t raw[32];
    return zmq_z85_decode(raw, s) != NULL;
}

// Reads a key file: "public <z85>" and, for a .key file, "secret <z85>". The file must be a
// regular file of this user, and for a secret key readable by nobody else.
static bool read_key_file(const char *path, bool secret, char pub[RT_KEY_Z85], char sec[RT_KEY_Z85],
                          dg_status *st) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        dg_status_setf(st, errno == ENOENT ? DG_NOT_FOUND : DG_PERMISSION_DENIED, "key file %s: %s", path,
                       strerror(errno));
        return false;
    }
    struct stat sb;
    char buf[MAX_KEY_FILE + 1];
    ssize_t n = -1;
    bool ok = false;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "key file %s: not a regular file", path);
    } else if (sb.st_uid != geteuid()) {
        dg_status_setf(st, DG_PERMISSION_DENIED, "key file %s: owned by uid %u, not by this user (uid %u)", path,
                       (unsigned)sb.st_uid, (unsigned)geteuid());
    } else if (secret && (sb.st_mode & 077) != 0) {
        dg_status_setf(st, DG_PERMISSION_DENIED, "key file %s: mode %03o lets others read the secret key; "
                       "chmod 600 it", path, (unsigned)(sb.st_mode & 0777));
    } else if ((sb.st_mode & 022) != 0) {
        dg_status_setf(st, DG_PERMISSION_DENIED, "key file %s: mode %03o lets others change it; chmod go-w it",
                       path, (unsigned)(sb.st_mode & 0777));
    } else if ((n = read(fd, buf, MAX_KEY_FILE)) < 0 || n == MAX_KEY_FILE) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "key file %s: %s", path, n < 0 ? strerror(errno) : "too long");
    } else {
        buf[n] = 0;
        char p[64] = "", s[64] = "";
        int got = sscanf(buf, "public %63s secret %63s", p, s);
        if (got < 1 || !is_z85_key(p)) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "key file %s: expected a line \"public <40-character Z85 key>\"",
                           path);
        } else if (secret && (got < 2 || !is_z85_key(s))) {
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "key file %s: expected a second line \"secret <40-character Z85 key>\"", path);
        } else {
            memcpy(pub, p, RT_KEY_Z85);
            if (secret) memcpy(sec, s, RT_KEY_Z85);
            ok = true;
        }
    }
    close(fd);
    explicit_bzero(buf, sizeof buf);
    return ok;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a > b && strcmp(s + a - b, suffix) == 0;
}

rt_keyring *rt_keyring_load(const char *dir, dg_status *st) {
    struct stat sb;
    if (!dir || !*dir) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "key directory: no path given");
        return NULL;
    }
    if (stat(dir, &sb) != 0) {
        dg_status_setf(st, DG_NOT_FOUND, "key directory %s: %s", dir, strerror(errno));
        return NULL;
    }
    if (!S_ISDIR(sb.st_mode)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "key directory %s: not a directory", dir);
        return NULL;
    }
    if (sb.st_uid != geteuid() || (sb.st_mode & 022) != 0) {
        dg_status_setf(st, DG_PERMISSION_DENIED, "key directory %s: owned by uid %u with mode %03o; it must be "
                       "this user's (uid %u) and writable by nobody else (chmod 700)", dir, (unsigned)sb.st_uid,
                       (unsigned)(sb.st_mode & 0777), (unsigned)geteuid());
        return NULL;
    }
    DIR *d = opendir(dir);
    if (!d) {
        dg_status_setf(st, DG_PERMISSION_DENIED, "key directory %s: %s", dir, strerror(errno));
        return NULL;
    }
    rt_keyring *k = calloc(1, sizeof *k);
    if (!k || !(k->dir = strdup(dir))) abort();
    int cap = 0;
    bool ok = true;
    struct dirent *e;
    while (ok && (e = readdir(d))) {
        bool is_pub = ends_with(e->d_name, ".pub"), is_key = ends_with(e->d_name, ".key");
        if (!is_pub && !is_key) continue;
        char path[4096], pub[RT_KEY_Z85], sec[RT_KEY_Z85];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (!read_key_file(path, is_key, pub, sec, st)) {
            ok = false;
            break;
        }
        explicit_bzero(sec, sizeof sec);
        uint8_t raw[32];
        zmq_z85_decode(raw, pub);
        bool seen = false;
        for (int i = 0; i < k->n_members && !seen; i++) seen = memcmp(k->members[i], raw, 32) == 0;
        if (seen) continue;
        if (k->n_members == MAX_MEMBERS) {
            dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "key directory %s: more than %d keys", dir, MAX_MEMBERS);
            ok = false;
            break;
        }
        if (k->n_members == cap) {
            cap = cap ? 2 * cap : 16;
            k->members = realloc(k->members, (size_t)cap * sizeof *k->members);
            if (!k->members) abort();
        }
        memcpy(k->members[k->n_members++], raw, 32);
    }
    closedir(d);
    if (ok && k->n_members == 0) {
        dg_status_setf(st, DG_NOT_FOUND, "key directory %s: no .key or .pub files in it", dir);
        ok = false;
    }
    if (!ok) rt_keyring_free(&k);
    return k;
}

void rt_keyring_free(rt_keyring **kp) {
    if (!kp || !*kp) return;
    free((*kp)->dir);
    free((*kp)->members);
    free(*kp);
    *kp = NULL;
}

const char *rt_keyring_dir(const rt_keyring *k) { return k->dir; }
int rt_keyring_size(const rt_keyring *k) { return k ? k->n_members : 0; }

static bool safe_name(const char *name) {
    if (!name || !*name || strlen(name) > 200) return false;
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' ||
              *c == '-' || *c == '.'))
            return false;
    return name[0] != '.';
}

bool rt_keyring_pair(const rt_keyring *k, const char *name, char pub[RT_KEY_Z85], char sec[RT_KEY_Z85],
                     dg_status *st) {
    if (!safe_name(name)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "key name \"%s\": letters, digits, '_', '-' and '.' only",
                       name ? name : "");
        return false;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.key", k->dir, name);
    return read_key_file(path, true, pub, sec, st);
}

void rt_key_name_of(const char *address, char *out, size_t cap) {
    if (strncmp(address, "tcp://", 6) == 0) address += 6;
    else if (strncmp(address, "dg://", 5) == 0) address += 5;
    size_t i = 0;
    for (; *address && i + 1 < cap; address++) {
        char c = *address;
        out[i++] = (c == ':' || c == '[' || c == ']' || c == '/') ? '_' : c;
    }
    out[i] = 0;
}

bool rt_keyring_server_key(const rt_keyring *k, const char *endpoint, char pub[RT_KEY_Z85], dg_status *st) {
    char name[256], path[4096], sec[RT_KEY_Z85];
    rt_key_name_of(endpoint, name, sizeof name);
    if (!safe_name(name)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "no key name for the address %s", endpoint);
        return false;
    }
    snprintf(path, sizeof path, "%s/%s.pub", k->dir, name);
    dg_status tmp = DG_STATUS_INIT;
    if (read_key_file(path, false, pub, sec, &tmp)) return true;
    status_impl_clear(&tmp);
    snprintf(path, sizeof path, "%s/%s.key", k->dir, name);
    bool ok = read_key_file(path, true, pub, sec, &tmp);
    explicit_bzero(sec, sizeof sec);
    if (!ok)
        dg_status_setf(st, DG_NOT_FOUND, "no public key for the task at %s: expected %s/%s.pub (or .key)", endpoint,
                       k->dir, name);
    status_impl_clear(&tmp);
    return ok;
}

bool rt_keyring_allows(const rt_keyring *k, const uint8_t key[32]) {
    for (int i = 0; k && i < k->n_members; i++)
        if (memcmp(k->members[i], key, 32) == 0) return true;
    return false;
}

static bool write_file(const char *path, const char *text, mode_t mode, dg_status *st) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) {
        dg_status_setf(st, errno == EEXIST ? DG_ALREADY_EXISTS : DG_PERMISSION_DENIED, "writing %s: %s", path,
                       strerror(errno));
        return false;
    }
    size_t len = strlen(text);
    bool ok = write(fd, text, len) == (ssize_t)len && fchmod(fd, mode) == 0 && fsync(fd) == 0;
    if (!ok) dg_status_setf(st, DG_DATA_LOSS, "writing %s: %s", path, strerror(errno));
    close(fd);
    return ok;
}

bool rt_keyring_generate(const char *dir, const char *name, dg_status *st) {
    if (!safe_name(name)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "key name \"%s\": letters, digits, '_', '-' and '.' only",
                       name ? name : "");
        return false;
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        dg_status_setf(st, DG_PERMISSION_DENIED, "key directory %s: %s", dir, strerror(errno));
        return false;
    }
    char pub[RT_KEY_Z85], sec[RT_KEY_Z85];
    if (zmq_curve_keypair(pub, sec) != 0) {
        dg_status_setf(st, DG_UNIMPLEMENTED, "CurveZMQ key pair: %s", zmq_strerror(zmq_errno()));
        return false;
    }
    char path[4096], text[160];
    snprintf(path, sizeof path, "%s/%s.key", dir, name);
    snprintf(text, sizeof text, "public %s\nsecret %s\n", pub, sec);
    bool ok = write_file(path, text, 0600, st);
    explicit_bzero(text, sizeof text);
    explicit_bzero(sec, sizeof sec);
    if (ok) {
        snprintf(path, sizeof path, "%s/%s.pub", dir, name);
        snprintf(text, sizeof text, "public %s\n", pub);
        ok = write_file(path, text, 0644, st);
    }
    return ok;
}
