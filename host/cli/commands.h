#ifndef CLMLA_CLI_COMMANDS_H
#define CLMLA_CLI_COMMANDS_H
/* Each subcommand: argv[0] is "clmla", argv[1] its name; returns the process exit code. */
int cmd_devices(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_kernels(int argc, char **argv);
#endif
