/*
 * A mock of NVRTC, for the server's compile path on machines without a
 * CUDA toolkit. It "compiles" the test kernels it recognises into a fake
 * PTX text that the mock driver's cuModuleLoadDataEx parses (one line per
 * kernel: `.scope_mock_entry NAME KIND PARAM_SIZE...`), where KIND is the
 * behaviour the driver runs: fill, copy, add, accumulate or wild, told
 * apart by the body (`.value`, `= in[i]`, `a[i] + b[i]`, `+=`, a cast of
 * a literal address). Parameter sizes come from the parameter list:
 * pointers are 8 bytes, a struct of `unsigned int` fields 4 per field.
 *
 * Like the driver mock it is a checker. A compile fails, as NVRTC does:
 *  - with NVRTC_ERROR_COMPILATION and NVRTC's wording
 *    (`scope_kernel.cu(1): error: identifier "x" is undefined`) when the
 *    source uses an identifier it never declares (a small scan: types,
 *    struct names, declarations after a type, CUDA's built-ins);
 *  - with NVRTC_ERROR_INVALID_OPTION unless exactly one option is
 *    `--gpu-architecture=compute_XY` for an XY this NVRTC advertises
 *    (nvrtcGetSupportedArchs: CUDA 13.0's list, or 12.2's), counted as a violation
 *    (scope_mock_nvrtc_violations): real NVRTC would silently pick its
 *    default architecture instead;
 *  - with NVRTC_ERROR_COMPILATION when it has no behaviour for a kernel
 *    (a limit of the mock, said so in the log).
 * Asking for PTX or its size before a successful compile is
 * NVRTC_ERROR_INVALID_PROGRAM, also counted.
 *
 * With SCOPE_MOCK_NVRTC_DUMP naming a directory, every source given to
 * nvrtcCompileProgram is also written there, as `<FNV-1a 64 of the
 * source>.cu` (so a source compiled many times is one file), before the
 * mock looks at it: how tests/toolchain.rs collects the CUDA C++ that
 * test binaries run on the mock emit, to compile it with the real NVRTC.
 *
 * Values are the CUDA 13.0 nvrtc.h's, as cudarc's bindings spell them.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { NVRTC_SUCCESS = 0, NVRTC_ERROR_INVALID_INPUT = 3, NVRTC_ERROR_INVALID_PROGRAM = 4,
       NVRTC_ERROR_INVALID_OPTION = 5, NVRTC_ERROR_COMPILATION = 6 };

/* Which NVRTC this is: 13.0 (PTX ISA 9.0), or 12.2 (PTX ISA 8.2, what the
 * CUDA bundle carries) where the build defines SCOPE_MOCK_NVRTC_VERSION=122.
 * Its version, the architectures it advertises and the `.version` of the
 * PTX it writes are that release's. */
#ifndef SCOPE_MOCK_NVRTC_VERSION
#define SCOPE_MOCK_NVRTC_VERSION 130
#endif
#if SCOPE_MOCK_NVRTC_VERSION == 130
static const int ARCHS[] = {75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121};
#define PTX_ISA "9.0"
#elif SCOPE_MOCK_NVRTC_VERSION == 122
static const int ARCHS[] = {50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90};
#define PTX_ISA "8.2"
#else
#error "SCOPE_MOCK_NVRTC_VERSION is 130 or 122"
#endif
#define NARCHS ((int)(sizeof ARCHS / sizeof *ARCHS))

static unsigned long long violations;
unsigned long long scope_mock_nvrtc_violations(void) { return __atomic_load_n(&violations, __ATOMIC_SEQ_CST); }
static void violation(const char *what) {
  __atomic_add_fetch(&violations, 1, __ATOMIC_SEQ_CST);
  fprintf(stderr, "mock nvrtc: refused: %s\n", what);
}

typedef struct { char *source, *name, *log, *ptx; } program;

int nvrtcVersion(int *major, int *minor) {
  *major = SCOPE_MOCK_NVRTC_VERSION / 10;
  *minor = SCOPE_MOCK_NVRTC_VERSION % 10;
  return NVRTC_SUCCESS;
}
int nvrtcGetNumSupportedArchs(int *n) { *n = NARCHS; return NVRTC_SUCCESS; }
int nvrtcGetSupportedArchs(int *archs) { memcpy(archs, ARCHS, sizeof ARCHS); return NVRTC_SUCCESS; }

int nvrtcCreateProgram(program **out, const char *src, const char *name, int n, const char *const *headers,
                       const char *const *names) {
  (void)headers; (void)names;
  if (!out || !src || n < 0) return NVRTC_ERROR_INVALID_INPUT;
  program *p = calloc(1, sizeof(program));
  p->source = strdup(src);
  p->name = strdup(name ? name : "default_program");
  p->log = strdup("");
  *out = p;
  return NVRTC_SUCCESS;
}

int nvrtcDestroyProgram(program **p) {
  if (!p || !*p) return NVRTC_ERROR_INVALID_PROGRAM;
  free((*p)->source); free((*p)->name); free((*p)->log); free((*p)->ptx); free(*p);
  *p = NULL;
  return NVRTC_SUCCESS;
}

/* ----- a token scan, enough to find undeclared identifiers ----- */

typedef struct { const char *at; size_t len; int line; int ident; } token;

static int lex(const char *s, token *out, int max) {
  int n = 0, line = 1;
  while (*s && n < max) {
    if (*s == '\n') { line++; s++; continue; }
    if (isspace((unsigned char)*s)) { s++; continue; }
    if (s[0] == '/' && s[1] == '/') { while (*s && *s != '\n') s++; continue; }
    if (s[0] == '/' && s[1] == '*') {
      s += 2;
      while (*s && !(s[0] == '*' && s[1] == '/')) { if (*s == '\n') line++; s++; }
      if (*s) s += 2;
      continue;
    }
    token t = {s, 1, line, 0};
    if (*s == '"') {
      const char *e = s + 1;
      while (*e && *e != '"') e += (*e == '\\' && e[1]) ? 2 : 1;
      t.len = (size_t)(e - s) + (*e ? 1 : 0);
    } else if (isalpha((unsigned char)*s) || *s == '_') {
      const char *e = s;
      while (isalnum((unsigned char)*e) || *e == '_') e++;
      t.len = (size_t)(e - s);
      t.ident = 1;
    } else if (isdigit((unsigned char)*s)) {
      const char *e = s;
      while (isalnum((unsigned char)*e) || *e == '.') e++;
      t.len = (size_t)(e - s);
    } else if (s[0] == '-' && s[1] == '>') {
      t.len = 2;
    }
    out[n++] = t;
    s += t.len;
  }
  return n;
}

static int is(const token *t, const char *word) { return t->len == strlen(word) && !strncmp(t->at, word, t->len); }

static const char *BUILTINS[] = {
  "extern", "__global__", "__device__", "__restrict__", "__shared__", "void", "unsigned", "signed", "int", "long",
  "short", "char", "float", "double", "bool", "const", "volatile", "struct", "if", "else", "for", "while", "return",
  "sizeof", "size_t", "blockIdx", "blockDim", "threadIdx", "gridDim", "true", "false", NULL};
static const char *TYPES[] = {"void", "unsigned", "signed", "int", "long", "short", "char", "float", "double",
                              "bool", "size_t", NULL};

static int in(const token *t, const char **words) {
  for (int i = 0; words[i]; i++) if (is(t, words[i])) return 1;
  return 0;
}

#define MAX_TOKENS 4096
#define MAX_NAMES 256

typedef struct { const token *names[MAX_NAMES]; int len; } names;
static int known(const names *set, const token *t) {
  for (int i = 0; i < set->len; i++)
    if (set->names[i]->len == t->len && !strncmp(set->names[i]->at, t->at, t->len)) return 1;
  return 0;
}
static void add(names *set, const token *t) { if (set->len < MAX_NAMES) set->names[set->len++] = t; }

/* The first identifier used but never declared, or NULL. */
static const token *undeclared(const token *t, int n) {
  names types = {0}, declared = {0};
  for (int i = 1; i < n; i++)
    if (t[i].ident && is(&t[i - 1], "struct")) add(&types, &t[i]);
  for (int i = 0; i < n; i++) {
    if (!t[i].ident || in(&t[i], BUILTINS) || known(&types, &t[i])) continue;
    int j = i - 1;
    while (j >= 0 && (is(&t[j], "*") || is(&t[j], "&") || is(&t[j], "__restrict__"))) j--;
    if (j >= 0 && (in(&t[j], TYPES) || known(&types, &t[j]))) { add(&declared, &t[i]); continue; }
    if (i > 0 && (is(&t[i - 1], ".") || is(&t[i - 1], "->"))) continue; /* a member */
    if (!known(&declared, &t[i])) return &t[i];
  }
  return NULL;
}

/* Bytes of one parameter declared as tokens [from, to). */
static size_t param_size(const token *t, int from, int to, const token *all, int n) {
  for (int i = from; i < to; i++) if (is(&t[i], "*")) return 8;
  for (int i = from; i < to; i++) {
    if (is(&t[i], "long") || is(&t[i], "double") || is(&t[i], "size_t")) return 8;
    if (!t[i].ident || in(&t[i], BUILTINS)) continue;
    /* A struct: 4 bytes per field (the tests' structs hold `unsigned int`s). */
    for (int j = 1; j + 1 < n; j++) {
      if (is(&all[j - 1], "struct") && all[j].len == t[i].len && !strncmp(all[j].at, t[i].at, t[i].len) &&
          is(&all[j + 1], "{")) {
        size_t fields = 0;
        for (int k = j + 2; k < n && !is(&all[k], "}"); k++) fields += is(&all[k], ";");
        return fields * 4;
      }
    }
    return 4;
  }
  return 4;
}

static int contains(const char *from, const char *to, const char *needle) {
  size_t len = strlen(needle);
  for (const char *p = from; p + len <= to; p++) if (!strncmp(p, needle, len)) return 1;
  return 0;
}

static const char *kind_of(const char *body, const char *end) {
  if (contains(body, end, "*)0x")) return "wild";
  if (contains(body, end, "+=")) return "accumulate";
  if (contains(body, end, "[i] + ")) return "add";
  if (contains(body, end, ".value")) return "fill";
  if (contains(body, end, "= in[i]")) return "copy";
  return NULL;
}

static void set_log(program *p, const char *text) { free(p->log); p->log = strdup(text); }

/* Write `source` into $SCOPE_MOCK_NVRTC_DUMP, if set, named by its hash;
 * written beside and renamed into place, so a reader never sees half a
 * file and two processes dumping the same source do not interleave. */
static void dump(const char *source) {
  const char *dir = getenv("SCOPE_MOCK_NVRTC_DUMP");
  if (!dir || !*dir) return;
  unsigned long long hash = 1469598103934665603ULL;
  for (const char *c = source; *c; c++) { hash ^= (unsigned char)*c; hash *= 1099511628211ULL; }
  char path[4096], partial[4200];
  snprintf(path, sizeof path, "%s/%016llx.cu", dir, hash);
  snprintf(partial, sizeof partial, "%s.%ld.partial", path, (long)getpid());
  FILE *f = fopen(partial, "w");
  if (!f) { fprintf(stderr, "mock nvrtc: cannot write %s\n", partial); return; }
  int ok = fputs(source, f) >= 0;
  ok = (fclose(f) == 0) && ok;
  if (!ok || rename(partial, path) != 0) { fprintf(stderr, "mock nvrtc: cannot write %s\n", path); remove(partial); }
}

int nvrtcCompileProgram(program *p, int n, const char *const *options) {
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  char buf[1024];
  int arch = 0, archs = 0;
  for (int i = 0; i < n; i++) {
    int xy;
    if (sscanf(options[i], "--gpu-architecture=compute_%d", &xy) == 1 || sscanf(options[i], "-arch=compute_%d", &xy) == 1) {
      archs++;
      for (int a = 0; a < NARCHS; a++) if (ARCHS[a] == xy) arch = xy;
    }
  }
  dump(p->source);
  if (archs != 1 || !arch) {
    snprintf(buf, sizeof buf, "nvrtc: error: invalid value for --gpu-architecture (-arch): expected one "
             "--gpu-architecture=compute_XY from nvrtcGetSupportedArchs (%d given)", archs);
    set_log(p, buf);
    violation(buf);
    return NVRTC_ERROR_INVALID_OPTION;
  }
  token *tokens = malloc(sizeof(token) * MAX_TOKENS);
  int count = lex(p->source, tokens, MAX_TOKENS);
  const token *bad = undeclared(tokens, count);
  if (bad) {
    snprintf(buf, sizeof buf, "%s(%d): error: identifier \"%.*s\" is undefined\n\n1 error detected in the "
             "compilation of \"%s\".\n", p->name, bad->line, (int)bad->len, bad->at, p->name);
    set_log(p, buf);
    free(tokens);
    return NVRTC_ERROR_COMPILATION;
  }
  size_t cap = 4096, len = 0;
  char *ptx = malloc(cap);
  len += (size_t)snprintf(ptx, cap, "//\n// Generated by the scope mock NVRTC\n//\n\n.version " PTX_ISA "\n.target sm_%d\n"
                          ".address_size 64\n\n", arch);
  int kernels = 0;
  for (int i = 0; i + 3 < count; i++) {
    if (!is(&tokens[i], "__global__") || !is(&tokens[i + 1], "void") || !is(&tokens[i + 3], "(")) continue;
    const token *name = &tokens[i + 2];
    int open = i + 3, close = open + 1;
    while (close < count && !is(&tokens[close], ")")) close++;
    int body = close + 1, depth = 0, end = body;
    for (; end < count; end++) {
      if (is(&tokens[end], "{")) depth++;
      if (is(&tokens[end], "}") && --depth == 0) break;
    }
    if (end >= count) break;
    const char *kind = kind_of(tokens[body].at, tokens[end].at);
    if (!kind) {
      snprintf(buf, sizeof buf, "%s(%d): error: the scope mock NVRTC has no behaviour for kernel \"%.*s\" "
               "(teach tests/mock/mock_nvrtc.c and mock_cuda.c)\n", p->name, name->line, (int)name->len, name->at);
      set_log(p, buf);
      free(ptx);
      free(tokens);
      return NVRTC_ERROR_COMPILATION;
    }
    char line[512];
    int at = snprintf(line, sizeof line, ".scope_mock_entry %.*s %s", (int)name->len, name->at, kind);
    int from = open + 1;
    for (int k = open + 1; k <= close && at < (int)sizeof line - 24; k++) {
      if (is(&tokens[k], ",") || k == close) {
        if (k > from) at += snprintf(line + at, sizeof line - (size_t)at, " %zu", param_size(tokens, from, k, tokens, count));
        from = k + 1;
      }
    }
    if (len + (size_t)at + 2 > cap) { cap = 2 * cap + (size_t)at; ptx = realloc(ptx, cap); }
    len += (size_t)snprintf(ptx + len, cap - len, "%s\n", line);
    kernels++;
  }
  free(tokens);
  free(p->ptx);
  p->ptx = ptx;
  set_log(p, kernels ? "" : "warning: no __global__ function in the program\n");
  return NVRTC_SUCCESS;
}

int nvrtcGetPTXSize(program *p, size_t *n) {
  if (!p || !p->ptx) { violation("nvrtcGetPTXSize before a successful compile"); return NVRTC_ERROR_INVALID_PROGRAM; }
  *n = strlen(p->ptx) + 1;
  return NVRTC_SUCCESS;
}
int nvrtcGetPTX(program *p, char *out) {
  if (!p || !p->ptx) { violation("nvrtcGetPTX before a successful compile"); return NVRTC_ERROR_INVALID_PROGRAM; }
  strcpy(out, p->ptx);
  return NVRTC_SUCCESS;
}
int nvrtcGetProgramLogSize(program *p, size_t *n) {
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  *n = strlen(p->log) + 1;
  return NVRTC_SUCCESS;
}
int nvrtcGetProgramLog(program *p, char *out) {
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  strcpy(out, p->log);
  return NVRTC_SUCCESS;
}
const char *nvrtcGetErrorString(int r) {
  switch (r) {
    case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
    case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
    case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
    case NVRTC_ERROR_INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
    case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
    default: return "NVRTC_ERROR_MOCK";
  }
}
