/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The stable layout of include/uapi/peermem.h (/dev/peermem, version 1),
 * as user space compiled on any ABI must see it: every size, offset and
 * number is fixed here, so a change to the header that moves one fails
 * this compile (tests/host/abi/run.sh compiles it for the host's 64-bit
 * ABI, its 32-bit ABI when the compiler has one, and as C++).
 * A deliberate change raises PEERMEM_EVENTS_VERSION and updates this file.
 */
#include <stddef.h>
#include "uapi/peermem.h"

#ifdef __cplusplus
#define SA static_assert
#else
#define SA _Static_assert
#endif

/* alignof in both languages */
struct peermem_event_align {
	char c;
	struct peermem_event e;
};
#define alignof_event offsetof(struct peermem_event_align, e)
#define OFF(t, f, v) SA(offsetof(struct t, f) == (v), #t "." #f " at offset " #v)
#define SIZE(t, v) SA(sizeof(struct t) == (v), "sizeof(struct " #t ") == " #v)
#define FSIZE(t, f, v) SA(sizeof(((struct t *)0)->f) == (v), #t "." #f " is " #v " bytes")

SA(PEERMEM_EVENTS_VERSION == 1, "interface version 1");
SA(PEERMEM_CLIENT_NAME_LEN == 64, "client names hold 64 bytes");

SIZE(peermem_event, 96);
SA(sizeof(void *) == 4 || alignof_event == 8, "records are 8-byte aligned on 64-bit ABIs");
OFF(peermem_event, generation, 0);
FSIZE(peermem_event, generation, 8);
OFF(peermem_event, start, 8);
FSIZE(peermem_event, start, 8);
OFF(peermem_event, length, 16);
FSIZE(peermem_event, length, 8);
OFF(peermem_event, cause, 24);
FSIZE(peermem_event, cause, 4);
OFF(peermem_event, flags, 28);
FSIZE(peermem_event, flags, 4);
OFF(peermem_event, client, 32);
FSIZE(peermem_event, client, 64);

SIZE(peermem_gen_page, 24);
OFF(peermem_gen_page, generation, 0);
FSIZE(peermem_gen_page, generation, 8);
OFF(peermem_gen_page, version, 8);
FSIZE(peermem_gen_page, version, 4);
OFF(peermem_gen_page, event_size, 12);
OFF(peermem_gen_page, queue_len, 16);
OFF(peermem_gen_page, reserved, 20);

SA(PEERMEM_CAUSE_GPU_FREE == 1, "cause gpu_free is 1");
SA(PEERMEM_CAUSE_UNMAP == 2, "cause unmap is 2");
SA(PEERMEM_CAUSE_MOVE == 3, "cause move is 3");
SA(PEERMEM_CAUSE_EXIT == 4, "cause exit is 4");
SA(PEERMEM_CAUSE_DRIVER == 5, "cause driver is 5");
SA(PEERMEM_CAUSE_PROTECT == 6, "cause protect is 6");
SA(PEERMEM_CAUSE_OVERFLOW == 0x100, "cause overflow is 0x100");

int main(void)
{
	return 0;
}
