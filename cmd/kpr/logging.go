package main

import (
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// kpr's log formats (--log-format, kube-proxy's --logging-format and its
// file's logging.format). logFormatConsole is kpr's earlier name for text.
const (
	logFormatJSON    = "json"
	logFormatText    = "text"
	logFormatConsole = "console"
)

// debugVerbosity is the klog verbosity of kpr's Debug lines. klog's
// convention, which kube-proxy's -v follows, puts debugging output at
// V(4); zap's Debug is one step below Info, V(1) by logr's mapping, so
// -v=2, kube-proxy's usual production setting, would turn on kpr's
// per-Service debug lines. Placing them at V(4) keeps what -v and
// --log-level=debug showed before verbosity was a real level.
const debugVerbosity = 4

// maxVerbosity is the deepest verbosity a zap level can hold (an int8).
const maxVerbosity = 127

// verbosityLevel is the zap level of klog's V(v) lines, as zapr maps them.
func verbosityLevel(v int) zapcore.Level { return zapcore.Level(-v) }

// verbosityOf is the klog verbosity of a line at l: 0 for Info and Warn.
func verbosityOf(l zapcore.Level) int { return max(0, -int(l)) }

// parseLogLevel reads --log-level: a level name or a klog verbosity, the
// form kube-proxy's -v and its file's logging.verbosity arrive in
// (verbositySetting).
func parseLogLevel(s string) (zapcore.Level, error) {
	if s == "debug" {
		return verbosityLevel(debugVerbosity), nil
	}
	if v, err := strconv.Atoi(s); err == nil {
		if _, err := verbositySetting("--log-level", v); err != nil {
			return 0, err
		}
		return verbosityLevel(v), nil
	}
	l, err := zapcore.ParseLevel(s)
	if err != nil {
		return 0, fmt.Errorf("--log-level %q: want error, warn, info, debug (the same as -v=%d) or a klog verbosity from 0 to 10", s, debugVerbosity)
	}
	return l, nil
}

// verbositySetting is klog's verbosity v, from the flag or field named,
// as the --log-level it amounts to.
func verbositySetting(from string, v int) (string, error) {
	if v < 0 || v > maxVerbosity {
		return "", fmt.Errorf("%s %d: want a klog verbosity, from 0 (info) to 10 (the most detail)", from, v)
	}
	return strconv.Itoa(v), nil
}

// checkLogFormat refuses a format kpr does not write, naming where it came
// from (a flag, or the file's field).
func checkLogFormat(from, format string) error {
	switch format {
	case logFormatJSON, logFormatText, logFormatConsole:
		return nil
	}
	return fmt.Errorf("%s %q: want text or json", from, format)
}

// newLoggers returns kpr's logger and client-go's (which klog's lines go
// through), both writing to w in format the lines at threshold and above.
// Neither samples: zap's production sampling dropped all but every 100th
// line of a message past 100 a second, however the lines' fields
// differed (one line per refused Service in a burst). Stack traces are for
// the levels that mean a bug (DPanic and above), and the JSON format, as
// component-base's, carries none: a warning or an error kpr logs is a
// condition of the node or the cluster, and its message says what to do.
func newLoggers(w zapcore.WriteSyncer, format string, threshold zapcore.Level) (*zap.Logger, *zap.Logger, error) {
	if err := checkLogFormat("--log-format", format); err != nil {
		return nil, nil, err
	}
	var core zapcore.Core
	if format == logFormatJSON {
		core = componentBaseFields{zapcore.NewCore(zapcore.NewJSONEncoder(componentBaseJSON), w, threshold)}
	} else {
		core = zapcore.NewCore(zapcore.NewConsoleEncoder(textEncoderConfig()), w, threshold)
	}
	opts := []zap.Option{zap.AddCaller(), zap.AddStacktrace(zapcore.DPanicLevel)}
	// client-go's V(1) is zapr's Debug level; only kpr's own Debug lines
	// move to V(4).
	return zap.New(debugAtV4{core}, opts...), zap.New(core, opts...).Named("client-go"), nil
}

// componentBaseJSON is the encoder of Kubernetes components' JSON log
// format (k8s.io/component-base/logs/json), so that a pipeline that parses
// kube-proxy's lines parses kpr's: ts in milliseconds since the epoch,
// caller, msg, the logger's name under logger, durations as Go writes
// them ("1.5s"), no level key (componentBaseFields adds v) and no stack
// trace.
var componentBaseJSON = zapcore.EncoderConfig{
	TimeKey:        "ts",
	NameKey:        "logger",
	CallerKey:      "caller",
	MessageKey:     "msg",
	EncodeTime:     epochMillis,
	EncodeDuration: zapcore.StringDurationEncoder,
	EncodeCaller:   zapcore.ShortCallerEncoder,
}

func epochMillis(t time.Time, enc zapcore.PrimitiveArrayEncoder) {
	enc.AppendFloat64(float64(t.UnixNano()) / float64(time.Millisecond))
}

// textEncoderConfig is the text format: what kpr printed as "console",
// one line per entry with the time (date and zone included), the level,
// the caller, the message and the fields as one JSON object, which a
// person reads and a test or grep can still take apart. V(n) lines show
// their verbosity as Vn, the -v that shows them.
func textEncoderConfig() zapcore.EncoderConfig {
	cfg := zap.NewDevelopmentEncoderConfig()
	cfg.EncodeLevel = textLevel
	return cfg
}

func textLevel(l zapcore.Level, enc zapcore.PrimitiveArrayEncoder) {
	if l < zapcore.InfoLevel {
		enc.AppendString("V" + strconv.Itoa(verbosityOf(l)))
		return
	}
	zapcore.CapitalLevelEncoder(l, enc)
}

// componentBaseFields adds what component-base's JSON lines carry besides
// the encoder's keys: "v", the line's verbosity, on every line below Error
// (a warning is v 0, as klog's Warning reaches component-base's logger),
// and the error under "err", where zap.Error puts it under "error".
type componentBaseFields struct{ zapcore.Core }

func (c componentBaseFields) With(fs []zapcore.Field) zapcore.Core {
	return componentBaseFields{c.Core.With(componentBaseKeys(fs, nil))}
}

func (c componentBaseFields) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c componentBaseFields) Write(e zapcore.Entry, fs []zapcore.Field) error {
	var first []zapcore.Field
	if e.Level < zapcore.ErrorLevel {
		first = []zapcore.Field{zap.Int("v", verbosityOf(e.Level))}
	}
	return c.Core.Write(e, componentBaseKeys(fs, first))
}

// componentBaseKeys returns first and then fs, with an error field
// renamed to component-base's "err". It copies: fs is the caller's.
func componentBaseKeys(fs, first []zapcore.Field) []zapcore.Field {
	out := make([]zapcore.Field, 0, len(first)+len(fs))
	out = append(out, first...)
	for _, f := range fs {
		if f.Type == zapcore.ErrorType && f.Key == "error" {
			f.Key = "err"
		}
		out = append(out, f)
	}
	return out
}

// debugAtV4 writes and filters kpr's Debug lines as klog's V(4)
// (debugVerbosity says why). Other levels pass as they are; kpr's logger
// so has no V(1), which is zap's Debug level: its V(n) lines take n of 2
// or more (log.Log(zapcore.Level(-n), ...)).
type debugAtV4 struct{ zapcore.Core }

func atV4(l zapcore.Level) zapcore.Level {
	if l == zapcore.DebugLevel {
		return verbosityLevel(debugVerbosity)
	}
	return l
}

func (c debugAtV4) Enabled(l zapcore.Level) bool { return c.Core.Enabled(atV4(l)) }

func (c debugAtV4) With(fs []zapcore.Field) zapcore.Core { return debugAtV4{c.Core.With(fs)} }

func (c debugAtV4) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	e.Level = atV4(e.Level)
	return c.Core.Check(e, ce)
}

func (c debugAtV4) Write(e zapcore.Entry, fs []zapcore.Field) error {
	e.Level = atV4(e.Level)
	return c.Core.Write(e, fs)
}
