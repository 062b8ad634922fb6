/* bind_shim: makes TensorFlow's gRPC server listen only on the address
 * TF_CONFIG names for this task, instead of every interface.
 *
 * tf.distribute.Server always asks gRPC for "[::]:port" (all interfaces)
 * whatever host TF_CONFIG gives. Loaded with LD_PRELOAD, this library wraps
 * bind(2): a bind to the wildcard address (0.0.0.0 or ::) on one of the
 * ports listed in TNET_BIND_PORTS is rewritten to the address in
 * TNET_BIND_HOST (an IPv4 or IPv6 literal). An IPv4 host on an IPv6
 * socket becomes the v4-mapped address ::ffff:a.b.c.d, which a dual-stack
 * socket (gRPC's default) accepts. Every other bind passes through.
 *
 * Plain C with no TensorFlow dependency: it is built as its own library
 * (tnet/_lib/libtnet_bind.so) and loaded before anything else runs.
 * tnet/bind.py sets the environment; see SECURITY.md.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr*, socklen_t);

static int port_listed(unsigned port) {
  const char* list = getenv("TNET_BIND_PORTS");
  if (list == NULL) return 0;
  while (*list) {
    char* end;
    unsigned long p = strtoul(list, &end, 10);
    if (end == list) return 0;
    if (p == port) return 1;
    list = (*end == ',') ? end + 1 : end;
    if (*end != ',' && *end != '\0') return 0;
  }
  return 0;
}

static void say(const char* what, const char* host, unsigned port) {
  if (getenv("TNET_BIND_QUIET") == NULL) {
    fprintf(stderr, "tnet bind: %s %s port %u\n", what, host, port);
  }
}

int bind(int fd, const struct sockaddr* addr, socklen_t len) {
  static bind_fn real_bind = NULL;
  if (real_bind == NULL) {
    real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    if (real_bind == NULL) {
      errno = ENOSYS;
      return -1;
    }
  }
  const char* host = getenv("TNET_BIND_HOST");
  if (host == NULL || addr == NULL) return real_bind(fd, addr, len);

  struct in_addr v4;
  struct in6_addr v6;
  int host_is_v4 = inet_pton(AF_INET, host, &v4) == 1;
  int host_is_v6 = !host_is_v4 && inet_pton(AF_INET6, host, &v6) == 1;
  if (!host_is_v4 && !host_is_v6) return real_bind(fd, addr, len);

  if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
    struct sockaddr_in a;
    memcpy(&a, addr, sizeof(a));
    unsigned port = ntohs(a.sin_port);
    if (a.sin_addr.s_addr != htonl(INADDR_ANY) || !port_listed(port)) {
      return real_bind(fd, addr, len);
    }
    if (!host_is_v4) {
      errno = EADDRNOTAVAIL;  /* an IPv6 host cannot take an IPv4 socket */
      return -1;
    }
    a.sin_addr = v4;
    say("listening only on", host, port);
    return real_bind(fd, (const struct sockaddr*)&a, sizeof(a));
  }
  if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 a;
    memcpy(&a, addr, sizeof(a));
    unsigned port = ntohs(a.sin6_port);
    if (memcmp(&a.sin6_addr, &in6addr_any, sizeof(in6addr_any)) != 0 ||
        !port_listed(port)) {
      return real_bind(fd, addr, len);
    }
    if (host_is_v4) {
      memset(&a.sin6_addr, 0, sizeof(a.sin6_addr));
      a.sin6_addr.s6_addr[10] = 0xff;
      a.sin6_addr.s6_addr[11] = 0xff;
      memcpy(&a.sin6_addr.s6_addr[12], &v4, 4);
    } else {
      a.sin6_addr = v6;
    }
    say("listening only on", host, port);
    return real_bind(fd, (const struct sockaddr*)&a, sizeof(a));
  }
  return real_bind(fd, addr, len);
}
