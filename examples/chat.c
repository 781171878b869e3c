/* chat.c: the libconverger-client example of the README. Subscribes to a
 * conversation from the start, sends one message, prints every message as
 * it arrives and exits once its own message has come back.
 *
 *   cc chat.c $(pkg-config --cflags --libs converger) -o chat
 *   ./chat ws://127.0.0.1:8080/v1/ws "$TOKEN" room1 ['hello']
 *
 * TEXT is optional ("hello"). Exit status: 0 once its message came back,
 * 1 when the client failed (a refused token, say), 2 for bad arguments.
 */
#include <converger/client.h>
#include <stdio.h>
#include <string.h>

typedef struct {
  cvg_client_t *client;
  const char *conv, *text;
  int64_t my_seq; /* 0 until `sent` */
  int sent, done;
} chat_t;

static void on_sent(void *ud, const char *conv, const char *id, int64_t seq, const char *error) {
  chat_t *chat = ud;
  if (error) {
    fprintf(stderr, "send failed: %s\n", error);
    chat->done = 1;
    cvg_client_close(chat->client, NULL, NULL);
    return;
  }
  chat->my_seq = seq;
  printf("sent as seq %lld (id %s)\n", (long long)seq, id);
  if (cvg_client_watermark(chat->client, conv) >= seq) { /* it came back before `sent` */
    chat->done = 1;
    cvg_client_close(chat->client, NULL, NULL);
  }
}

static void on_state(void *ud, cvg_state_t state, const char *detail) {
  chat_t *chat = ud;
  fprintf(stderr, "[%s] %s\n", cvg_state_name(state), detail);
  if (state == CVG_STATE_CONNECTED && !chat->sent) {
    char body[512];
    snprintf(body, sizeof body, "{\"text\":\"%.400s\"}", chat->text); /* plain text only */
    chat->sent = cvg_send(chat->client, chat->conv, NULL, body, on_sent, chat) == 0;
  }
  if (state == CVG_STATE_FAILED && !chat->done) {
    chat->done = 1;
    cvg_client_close(chat->client, NULL, NULL);
  }
}

static void on_message(void *ud, const cvg_message_t *m) {
  chat_t *chat = ud;
  printf("%s #%lld %s: %s\n", m->conv, (long long)m->seq, m->sender, m->body);
  if (chat->my_seq && m->seq >= chat->my_seq && !chat->done) {
    chat->done = 1; /* our message came back: every earlier one was printed */
    cvg_client_close(chat->client, NULL, NULL);
  }
}

int main(int argc, char **argv) {
  if (argc < 4 || argc > 5) {
    fprintf(stderr,
            "usage: %s WS_URL TOKEN CONV [TEXT]\n"
            "  prints CONV's messages, sends TEXT (default \"hello\") and exits once it came back\n"
            "  e.g. %s ws://127.0.0.1:8080/v1/ws \"$(converger token --sub me --convs room1)\" room1\n",
            argv[0], argv[0]);
    return 2;
  }
  chat_t chat = {.conv = argv[3], .text = argc == 5 ? argv[4] : "hello"};
  const char *urls[] = {argv[1]};
  cvg_sub_t sub = {argv[3], 0}; /* watermark 0: the whole history */
  cvg_options_t o;
  cvg_options_init(&o); /* decorrelated jitter, 250 ms to 10 s, migrate on drain */
  o.urls = urls;
  o.nurls = 1;
  o.token = argv[2];
  o.subs = &sub;
  o.nsubs = 1;
  o.cb.on_message = on_message;
  o.cb.on_state = on_state;
  o.userdata = &chat;

  uv_loop_t *loop = uv_default_loop();
  char err[256];
  if (cvg_client_new(loop, &o, &chat.client, err, sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    return 2;
  }
  cvg_client_start(chat.client);
  uv_run(loop, UV_RUN_DEFAULT); /* returns once the client is closed */
  uv_loop_close(loop);
  return chat.my_seq ? 0 : 1;
}
