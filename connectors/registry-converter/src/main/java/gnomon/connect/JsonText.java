package gnomon.connect;

import java.util.Base64;
import java.util.Collection;
import java.util.Date;
import java.util.Map;
import org.apache.kafka.connect.data.Field;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.data.Timestamp;

/**
 * A Connect value as one line of JSON (RFC 8259): structs are objects with the fields in
 * schema order, nulls null, strings escaped (no raw control characters, so never a line
 * break), bytes base64, Timestamps epoch milliseconds, non-finite floats null.
 */
final class JsonText {
    private JsonText() {}

    static String of(Schema schema, Object value) {
        StringBuilder out = new StringBuilder(256);
        write(out, schema, value);
        return out.toString();
    }

    private static void write(StringBuilder out, Schema schema, Object value) {
        if (value == null) {
            out.append("null");
            return;
        }
        switch (schema.type()) {
            case STRUCT: {
                Struct struct = (Struct) value;
                out.append('{');
                boolean first = true;
                for (Field f : schema.fields()) {
                    if (!first) {
                        out.append(',');
                    }
                    first = false;
                    string(out, f.name());
                    out.append(':');
                    write(out, f.schema(), struct.get(f));
                }
                out.append('}');
                return;
            }
            case ARRAY: {
                out.append('[');
                boolean first = true;
                for (Object item : (Collection<?>) value) {
                    if (!first) {
                        out.append(',');
                    }
                    first = false;
                    write(out, schema.valueSchema(), item);
                }
                out.append(']');
                return;
            }
            case MAP: {
                out.append('{');
                boolean first = true;
                for (Map.Entry<?, ?> e : ((Map<?, ?>) value).entrySet()) {
                    if (!first) {
                        out.append(',');
                    }
                    first = false;
                    string(out, String.valueOf(e.getKey()));
                    out.append(':');
                    write(out, schema.valueSchema(), e.getValue());
                }
                out.append('}');
                return;
            }
            case STRING:
                string(out, value.toString());
                return;
            case BYTES:
                string(out, Base64.getEncoder().encodeToString((byte[]) value));
                return;
            case FLOAT32:
            case FLOAT64: {
                double d = ((Number) value).doubleValue();
                out.append(Double.isFinite(d) ? value.toString() : "null");
                return;
            }
            case INT64:
                if (Timestamp.LOGICAL_NAME.equals(schema.name()) && value instanceof Date date) {
                    out.append(date.getTime());
                    return;
                }
                out.append(value);
                return;
            default:  // INT8..INT32, BOOLEAN
                out.append(value);
        }
    }

    private static void string(StringBuilder out, String s) {
        out.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20 || c == 0x2028 || c == 0x2029) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        out.append('"');
    }
}
