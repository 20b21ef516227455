/* Bare-metal driver of a tpugen tpu_core: see tpu.h. */
#include "tpu.h"

#if (TPU_VERSION_VALUE & TPU_VERSION_MAJOR_MASK) >> TPU_VERSION_MAJOR_SHIFT != 1
#error "tpu.c is written for register map version 1.x: regenerate tpu_params.h or update tpu.c"
#endif

/* STATUS reads after a soft reset before the core must show it (the AXI4-Lite write response
 * may come back before the reset has reached the datapath). */
#define TPU_SOFT_RESET_POLLS 16u

#define TPU_IRQ_CAUSES (TPU_IRQ_STATUS_DONE_MASK | TPU_IRQ_STATUS_ERROR_MASK)

static uint32_t field(uint32_t word, uint32_t mask, uint32_t shift)
{
    return (word & mask) >> shift;
}

void tpu_open(struct tpu *dev, volatile void *base)
{
    dev->regs = (volatile uint32_t *)base;
    dev->read = NULL;
    dev->write = NULL;
    dev->context = NULL;
}

void tpu_open_io(struct tpu *dev, tpu_read_fn read, tpu_write_fn write, void *context)
{
    dev->regs = NULL;
    dev->read = read;
    dev->write = write;
    dev->context = context;
}

uint32_t tpu_read(const struct tpu *dev, uint32_t offset)
{
    return dev->read ? dev->read(dev->context, offset) : dev->regs[offset / 4u];
}

void tpu_write(const struct tpu *dev, uint32_t offset, uint32_t value)
{
    if (dev->write)
        dev->write(dev->context, offset, value);
    else
        dev->regs[offset / 4u] = value;
}

static int busy(const struct tpu *dev)
{
    return (tpu_read(dev, TPU_REG_STATUS) & TPU_STATUS_BUSY_MASK) != 0;
}

static enum tpu_result check_identity(const struct tpu *dev)
{
    static const uint32_t config[][2] = {
        {TPU_REG_CONFIG0, TPU_CONFIG0_VALUE},
        {TPU_REG_CONFIG1, TPU_CONFIG1_VALUE},
        {TPU_REG_CONFIG2, TPU_CONFIG2_VALUE},
        {TPU_REG_SCRATCHPAD_ROWS, TPU_SCRATCHPAD_ROWS_VALUE},
        {TPU_REG_ACCUMULATOR_ROWS, TPU_ACCUMULATOR_ROWS_VALUE},
    };
    uint32_t version;
    size_t i;

    if (tpu_read(dev, TPU_REG_ID) != TPU_ID_VALUE)
        return TPU_ERR_NO_DEVICE;
    version = tpu_read(dev, TPU_REG_VERSION);
    if (field(version, TPU_VERSION_MAJOR_MASK, TPU_VERSION_MAJOR_SHIFT)
            != field(TPU_VERSION_VALUE, TPU_VERSION_MAJOR_MASK, TPU_VERSION_MAJOR_SHIFT)
        || field(version, TPU_VERSION_MINOR_MASK, TPU_VERSION_MINOR_SHIFT)
            < field(TPU_VERSION_VALUE, TPU_VERSION_MINOR_MASK, TPU_VERSION_MINOR_SHIFT))
        return TPU_ERR_VERSION;
    for (i = 0; i < sizeof config / sizeof config[0]; i++)
        if (tpu_read(dev, config[i][0]) != config[i][1])
            return TPU_ERR_CONFIG;
    return TPU_OK;
}

enum tpu_result tpu_init(const struct tpu *dev)
{
    enum tpu_result result;
    unsigned i;

    if (!dev)
        return TPU_ERR_ARGUMENT;
    result = check_identity(dev);
    if (result != TPU_OK)
        return result;
    result = tpu_soft_reset(dev);
    if (result != TPU_OK)
        return result;
    tpu_irq_enable(dev, 0);
    for (i = 0; i < TPU_NUM_WINDOWS; i++)
        tpu_set_window(dev, i, 0, 0, 0);
    return TPU_OK;
}

enum tpu_result tpu_soft_reset(const struct tpu *dev)
{
    uint32_t poll;

    if (!dev)
        return TPU_ERR_ARGUMENT;
    tpu_write(dev, TPU_REG_CONTROL, TPU_CONTROL_SOFT_RESET_MASK);
    for (poll = 0; poll < TPU_SOFT_RESET_POLLS; poll++)
        if (!busy(dev))
            return TPU_OK;
    return TPU_ERR_BUSY;
}

enum tpu_result tpu_set_window(const struct tpu *dev, unsigned index, uint32_t base,
                               uint32_t size, uint32_t flags)
{
    if (!dev || index >= TPU_NUM_WINDOWS || flags & ~(TPU_WINDOW_READ | TPU_WINDOW_WRITE))
        return TPU_ERR_ARGUMENT;
    if (busy(dev))
        return TPU_ERR_BUSY;
    tpu_write(dev, TPU_REG_WINDOW_BASE(index), base);
    tpu_write(dev, TPU_REG_WINDOW_SIZE(index), size);
    tpu_write(dev, TPU_REG_WINDOW_FLAGS(index), flags);
    return TPU_OK;
}

enum tpu_result tpu_set_program(const struct tpu *dev, uint32_t base, uint32_t length)
{
    if (!dev)
        return TPU_ERR_ARGUMENT;
    if (busy(dev))
        return TPU_ERR_BUSY;
    tpu_write(dev, TPU_REG_PROGRAM_BASE, base);
    tpu_write(dev, TPU_REG_PROGRAM_LENGTH, length);
    return TPU_OK;
}

enum tpu_result tpu_set_watchdog(const struct tpu *dev, uint32_t cycles)
{
    if (!dev)
        return TPU_ERR_ARGUMENT;
    if (busy(dev))
        return TPU_ERR_BUSY;
    tpu_write(dev, TPU_REG_WATCHDOG, cycles);
    return TPU_OK;
}

void tpu_irq_enable(const struct tpu *dev, int enable)
{
    tpu_write(dev, TPU_REG_IRQ_ENABLE, enable ? TPU_IRQ_ENABLE_ENABLE_MASK : 0u);
}

uint32_t tpu_irq_ack(const struct tpu *dev)
{
    uint32_t pending = tpu_read(dev, TPU_REG_IRQ_STATUS) & TPU_IRQ_CAUSES;

    if (pending)
        tpu_write(dev, TPU_REG_IRQ_STATUS, pending);
    return pending;
}

enum tpu_result tpu_start(const struct tpu *dev)
{
    if (!dev)
        return TPU_ERR_ARGUMENT;
    if (busy(dev))
        return TPU_ERR_BUSY;
    tpu_write(dev, TPU_REG_IRQ_STATUS, TPU_IRQ_CAUSES);
    tpu_write(dev, TPU_REG_CONTROL, TPU_CONTROL_START_MASK);
    return TPU_OK;
}

static enum tpu_result outcome(uint32_t status)
{
    if (status & TPU_STATUS_ERROR_MASK)
        return TPU_ERR_CORE;
    if (status & TPU_STATUS_DONE_MASK)
        return TPU_OK;
    return TPU_ERR_TIMEOUT;
}

enum tpu_result tpu_wait(const struct tpu *dev, const struct tpu_wait *wait)
{
    enum tpu_result result = TPU_ERR_TIMEOUT;
    uint32_t poll;

    if (!dev || !wait)
        return TPU_ERR_ARGUMENT;
    if (wait->irq_wait) {
        wait->irq_wait(wait->context);
        return outcome(tpu_read(dev, TPU_REG_STATUS));
    }
    for (poll = 0; poll < wait->max_polls && result == TPU_ERR_TIMEOUT; poll++)
        result = outcome(tpu_read(dev, TPU_REG_STATUS));
    return result;
}

/* The order of tpugen/run_protocol.py (run_program), which the Python hosts use: program,
 * IRQ_ENABLE, stale causes acknowledged, START; wait; STATUS; the causes read acknowledged. */
enum tpu_result tpu_run(const struct tpu *dev, uint32_t program_base, uint32_t program_length,
                        const struct tpu_wait *wait)
{
    enum tpu_result result;

    if (!dev || !wait)
        return TPU_ERR_ARGUMENT;
    result = tpu_set_program(dev, program_base, program_length);
    if (result != TPU_OK)
        return result;
    tpu_irq_enable(dev, wait->irq_wait != NULL);
    result = tpu_start(dev);
    if (result != TPU_OK)
        return result;
    result = tpu_wait(dev, wait);
    if (result != TPU_ERR_TIMEOUT)
        tpu_irq_ack(dev);
    return result;
}

struct tpu_error tpu_read_error(const struct tpu *dev)
{
    struct tpu_error error;

    error.code = field(tpu_read(dev, TPU_REG_ERROR_CODE), TPU_ERROR_CODE_CODE_MASK,
                       TPU_ERROR_CODE_CODE_SHIFT);
    error.index = tpu_read(dev, TPU_REG_ERROR_INDEX);
    return error;
}

enum tpu_result tpu_read_counter(const struct tpu *dev, unsigned counter, uint64_t *value)
{
    uint32_t low;

    if (!dev || !value || counter >= TPU_NUM_COUNTERS)
        return TPU_ERR_ARGUMENT;
    low = tpu_read(dev, TPU_REG_COUNTER_LO(counter));
    *value = (uint64_t)tpu_read(dev, TPU_REG_COUNTER_HI(counter)) << 32 | low;
    return TPU_OK;
}
