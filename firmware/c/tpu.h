/* Bare-metal driver of a tpugen tpu_core: its AXI4-Lite control registers.
 *
 * Plain C99, no libc beyond <stdint.h>/<stddef.h>, no allocation, no global state; every wait
 * is bounded. Build tpu.c with the "tpu_params.h" that `tpugen generate --header` wrote for the
 * core: tpu_init() checks the hardware against it.
 */
#ifndef TPU_H
#define TPU_H

#include <stddef.h>
#include <stdint.h>

#include "tpu_params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What every driver call returns. (TPU_ERROR_* are the core's own ERROR_CODE values.) */
enum tpu_result {
    TPU_OK = 0,
    TPU_ERR_ARGUMENT,   /* a NULL pointer or an index out of range */
    TPU_ERR_NO_DEVICE,  /* ID does not read TPU_ID_VALUE */
    TPU_ERR_VERSION,    /* register map of another major version, or an older minor one */
    TPU_ERR_CONFIG,     /* CONFIG0/1/2 or SCRATCHPAD/ACCUMULATOR_ROWS differ from tpu_params.h */
    TPU_ERR_BUSY,       /* a program is running (start refused, or a soft reset did not stop it) */
    TPU_ERR_TIMEOUT,    /* the program has not finished within the wait; it is still running */
    TPU_ERR_CORE        /* the program stopped with an error: see tpu_read_error() */
};

typedef uint32_t (*tpu_read_fn)(void *context, uint32_t offset);
typedef void (*tpu_write_fn)(void *context, uint32_t offset, uint32_t value);

/* One core. Fill it with tpu_open() (memory-mapped) or tpu_open_io() (through functions). */
struct tpu {
    volatile uint32_t *regs;  /* the mapped AXI4-Lite base, used when read is NULL */
    tpu_read_fn read;         /* register access through functions: a bridge, a test model */
    tpu_write_fn write;
    void *context;            /* passed to read and write */
};

/* How tpu_wait() waits for the end of a program. */
struct tpu_wait {
    uint32_t max_polls;              /* without irq_wait: STATUS reads before TPU_ERR_TIMEOUT */
    void (*irq_wait)(void *context); /* if set: return once the core's irq fired or the
                                        caller's own timeout passed; STATUS then tells which */
    void *context;                   /* passed to irq_wait */
};

/* ERROR_CODE and ERROR_INDEX: what stopped the last program. */
struct tpu_error {
    uint32_t code;   /* a TPU_ERROR_* value (TPU_ERROR_NONE: no error) */
    uint32_t index;  /* index of the faulting instruction */
};

void tpu_open(struct tpu *dev, volatile void *base);
void tpu_open_io(struct tpu *dev, tpu_read_fn read, tpu_write_fn write, void *context);

uint32_t tpu_read(const struct tpu *dev, uint32_t offset);
void tpu_write(const struct tpu *dev, uint32_t offset, uint32_t value);

/* Check ID, VERSION and the configuration registers against tpu_params.h (nothing is written
 * if they differ), then soft-reset the core, disable its interrupt and every access window. */
enum tpu_result tpu_init(const struct tpu *dev);
/* Stop any program; clear STATUS, IRQ_STATUS and the error. Configuration registers stay. */
enum tpu_result tpu_soft_reset(const struct tpu *dev);

/* The setters refuse (TPU_ERR_BUSY) while a program runs: it reads these registers.
 * Window `index` (< TPU_NUM_WINDOWS): `size` bytes from `base` (0: disabled), flags a mask of
 * TPU_WINDOW_READ and TPU_WINDOW_WRITE. A core with fewer windows (CONFIG1.windows, checked by
 * tpu_init) ignores the others: their registers read 0, so setting one is harmless. */
enum tpu_result tpu_set_window(const struct tpu *dev, unsigned index, uint32_t base,
                               uint32_t size, uint32_t flags);
/* `length` instructions of TPU_INSTRUCTION_BYTES from byte address `base`. */
enum tpu_result tpu_set_program(const struct tpu *dev, uint32_t base, uint32_t length);
/* Cycles without progress before the core stops with TPU_ERROR_WATCHDOG (0: never). */
enum tpu_result tpu_set_watchdog(const struct tpu *dev, uint32_t cycles);

void tpu_irq_enable(const struct tpu *dev, int enable);
/* Acknowledge every pending interrupt cause; returns them (IRQ_STATUS bits). */
uint32_t tpu_irq_ack(const struct tpu *dev);

/* Acknowledge stale interrupts and start the program set by tpu_set_program(). */
enum tpu_result tpu_start(const struct tpu *dev);
/* TPU_OK when the program reached END, TPU_ERR_CORE when it stopped with an error,
 * TPU_ERR_TIMEOUT when it has not finished yet. */
enum tpu_result tpu_wait(const struct tpu *dev, const struct tpu_wait *wait);
/* Set the program, enable the irq if wait->irq_wait is set (else disable it), start, wait,
 * acknowledge the irq. On TPU_ERR_TIMEOUT the program is still running: call tpu_wait()
 * again or stop it with tpu_soft_reset(). */
enum tpu_result tpu_run(const struct tpu *dev, uint32_t program_base, uint32_t program_length,
                        const struct tpu_wait *wait);

struct tpu_error tpu_read_error(const struct tpu *dev);
/* Counter `counter` (a TPU_COUNTER_* index), 64 bits read as LO then HI. */
enum tpu_result tpu_read_counter(const struct tpu *dev, unsigned counter, uint64_t *value);

#ifdef __cplusplus
}
#endif

#endif /* TPU_H */
